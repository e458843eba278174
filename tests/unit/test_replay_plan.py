"""Replay's pure parts: lineage, regrouping, verifier overrides, reward-map re-scoring,
throttling, instants and offset spans."""

from __future__ import annotations

import pytest

from schemas import codec
from schemas.envelope import Origin
from schemas.rollout import ScoredTrajectory, Trajectory
from schemas.sandbox import Outcome, VerifierSpec
from services.kafka_read import Selection, plan_span
from services.replay_plan import (
    GroupPlan,
    TokenBucket,
    derive,
    override_verifier,
    parse_instant,
    replay_group_id,
    rescore_group,
)
from services.settings import RewardsSettings

EXACT = VerifierSpec(name="exact", answer="42", needs_sandbox=False)


def traj(group: str, index: int, size: int = 4, answer: str = "42") -> Trajectory:
    return Trajectory(
        task_id="t", group_id=group, group_size=size, index=index, verifier=EXACT, completion=answer
    )


def test_derive_sets_lineage_and_keeps_the_content() -> None:
    plan = GroupPlan(tag="abc")
    original = traj("g1", 2)
    assert plan.add(original)
    new = derive(original, plan)
    assert new.id != original.id and new.parent_id == original.id
    assert new.origin is Origin.REPLAY
    assert (new.group_id, new.group_size, new.index) == ("g1~abc", 1, 0)
    assert (new.completion, new.verifier, new.task_id) == ("42", EXACT, "t")
    assert codec.validate(new) == new  # a valid wire message


def test_groups_cut_by_the_selection_are_regrouped_complete_and_duplicates_counted() -> None:
    plan = GroupPlan(tag="t1")
    members = [traj("g", i) for i in (3, 0, 2)]  # index 1 of the original group missing
    for m in members:
        plan.add(m)
    assert not plan.add(members[0])  # a redelivered record
    assert (plan.trajectories, plan.groups, plan.duplicates) == (3, 1, 1)
    placed = [plan.place(m) for m in members]
    assert placed == [("g~t1", 3, 0), ("g~t1", 3, 1), ("g~t1", 3, 2)]
    with pytest.raises(KeyError):
        plan.place(traj("g", 1))


def test_replay_group_id_stays_a_valid_key() -> None:
    long = "x" * 256
    assert len(replay_group_id(long, "0123456789")) <= 256
    assert replay_group_id("g", "t") == "g~t"


def test_override_verifier_replaces_fields_or_starts_fresh_on_a_new_name() -> None:
    assert override_verifier(EXACT, {"version": "2.0"}).version == "2.0"
    assert override_verifier(EXACT, {"version": "2.0"}).answer == "42"
    swapped = override_verifier(EXACT, {"name": "regex", "pattern": "4."})
    assert (swapped.name, swapped.pattern, swapped.answer) == ("regex", "4.", None)
    assert not swapped.needs_sandbox
    tests = override_verifier(EXACT, {"name": "python_tests", "tests": "def test_x(): pass"})
    assert tests.needs_sandbox and tests.answer is None
    forced = override_verifier(EXACT, {"name": "math_answer", "needs_sandbox": True})
    assert forced.needs_sandbox
    with pytest.raises(ValueError, match="unknown verifier field"):
        override_verifier(EXACT, {"answr": "1"})
    with pytest.raises(ValueError, match="invalid verifier override"):
        override_verifier(EXACT, {"needs_sandbox": "maybe"})


def test_derive_with_a_verifier_override() -> None:
    plan = GroupPlan()
    t = traj("g", 0, size=1)
    plan.add(t)
    new = derive(t, plan, {"name": "math_answer", "answer": "42"})
    assert new.verifier.name == "math_answer" and t.verifier.name == "exact"


def _scored(t: Trajectory, outcome: Outcome, passed: int, total: int) -> ScoredTrajectory:
    return ScoredTrajectory(
        trajectory=t, reward=0.5, outcome=outcome, passed=passed, total=total, parent_id=t.id
    )


def test_rescore_group_applies_the_new_map_and_new_advantages() -> None:
    plan = GroupPlan(tag="r")
    originals = [traj("g", i, size=3) for i in range(3)]
    verdicts = [(Outcome.PASSED, 2, 2), (Outcome.FAILED, 1, 2), (Outcome.SANDBOX_ERROR, 0, 0)]
    for t in originals:
        plan.add(t)
    pairs = [(_scored(t, *v), derive(t, plan)) for t, v in zip(originals, verdicts, strict=True)]
    strict = RewardsSettings(mode="all_pass")
    out = rescore_group(pairs, strict, "replay-test")
    assert [s.reward for s in out] == [1.0, 0.0, 0.0]  # half the tests is a fail now
    assert [round(s.advantage, 6) for s in out] == [1.0, -1.0, 0.0]
    assert out[2].masked and out[2].mask_reason
    for s, (_, new) in zip(out, pairs, strict=True):
        assert s.trajectory is new and s.parent_id == new.id and s.origin is Origin.REPLAY
        assert s.id == f"{new.id}:scored" and s.group_size_scored == 2
    lenient = rescore_group(pairs, RewardsSettings(), "replay-test")
    assert [s.reward for s in lenient] == [1.0, 0.5, 0.0]


def test_token_bucket_paces_after_the_burst() -> None:
    now = [0.0]
    bucket = TokenBucket(rate=10.0, burst=3, clock=lambda: now[0])
    assert [bucket.wait() for _ in range(3)] == [0.0, 0.0, 0.0]
    assert bucket.wait() == pytest.approx(0.1)
    now[0] += 0.1  # the caller slept as told
    assert bucket.wait() == pytest.approx(0.1)
    now[0] += 10.0  # refill caps at the burst
    assert [bucket.wait() for _ in range(3)] == [0.0, 0.0, 0.0]
    assert bucket.wait() > 0
    assert TokenBucket(0, 1).wait(10_000) == 0.0  # rate 0: unlimited
    with pytest.raises(ValueError):
        TokenBucket(-1, 1)


def test_parse_instant_forms() -> None:
    now = 1_700_000_000.0
    assert parse_instant("15m", now) == (now - 900) * 1000
    assert parse_instant("-2h", now) == (now - 7200) * 1000
    assert parse_instant("1700000000.5", now) == 1_700_000_000_500
    assert parse_instant("2023-11-14T22:13:20Z", now) == 1_700_000_000_000
    assert parse_instant("2023-11-14T22:13:20", now) == 1_700_000_000_000  # UTC
    assert parse_instant("2023-11-14T23:13:20+01:00", now) == 1_700_000_000_000
    with pytest.raises(ValueError, match="ISO 8601"):
        parse_instant("yesterday", now)


def test_plan_span_intersects_offsets_and_time_window() -> None:
    assert plan_span(0, 5, 100, Selection()) == plan_span(0, 5, 100, Selection(start_offset=0))
    assert plan_span(0, 5, 100, Selection()).size == 95
    span = plan_span(1, 5, 100, Selection(start_offset=10, end_offset=50))
    assert (span.start, span.end) == (10, 50)
    window = Selection(since_ms=1, until_ms=2)
    assert (
        plan_span(0, 0, 100, window, 40, 60).start,
        plan_span(0, 0, 100, window, 40, 60).end,
    ) == (40, 60)
    # nothing at or after `since`: empty; nothing at or after `until`: up to the end
    assert plan_span(0, 0, 100, window, None, None).size == 0
    assert plan_span(0, 0, 100, window, 70, None).end == 100
    both = Selection(start_offset=50, since_ms=1)
    assert plan_span(0, 0, 100, both, 20).start == 50
    assert plan_span(0, 0, 100, Selection(start_offset=80, end_offset=20)).size == 0
