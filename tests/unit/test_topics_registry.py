from schemas import topics


def test_names_unique_and_prefixed() -> None:
    names = [t.name for t in topics.ALL]
    assert len(names) == len(set(names)) == 10
    assert topics.TRAJECTORIES.full_name("exp1") == "exp1.trajectories"
    assert set(topics.BY_NAME) == set(names)


def test_group_keyed_topics_are_co_partitioned() -> None:
    group_keyed = [t for t in topics.ALL if t.key == "group_id"]
    assert {t.name for t in group_keyed} == {"trajectories", "sandbox.results", "rewards"}
    assert {t.partition_count(6) for t in group_keyed} == {6}


def test_weights_compacted_others_expire() -> None:
    assert topics.WEIGHTS.compacted
    assert topics.WEIGHTS.configs()["cleanup.policy"] == "compact"
    for t in topics.ALL:
        if not t.compacted:
            assert t.configs() == {"cleanup.policy": "delete", "retention.ms": str(t.retention_ms)}
            assert t.retention_ms > 0


def test_feedback_keyed_by_trace() -> None:
    assert topics.FEEDBACK.key == "trace_id"
    assert topics.FEEDBACK.schemas == ("Feedback",)
    assert topics.BY_NAME["feedback"] is topics.FEEDBACK
