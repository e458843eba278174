"""Generator logic: pacing, trajectory assembly (single- and multi-turn), weight checks,
the text codec of the tiny policy."""

from __future__ import annotations

import pytest

from schemas import codec
from schemas.arrays import unpack_f32, unpack_i32
from schemas.rollout import Task
from schemas.sandbox import Outcome, SandboxResult, VerifierSpec
from services.rollout import episode, pacing
from services.rollout.weights_watch import state_problem

TASK = Task(
    task_id="pyfunc/add/3",
    suite="pyfunc",
    prompt="# f(x) returns x plus 3\n",
    verifier=VerifierSpec(name="python_tests", tests="from solution import f\n"),
    group_size=4,
    max_turns=3,
)


# -- pacing -----------------------------------------------------------------------------


def test_window_is_max_lag_plus_one_batches() -> None:
    assert pacing.window(max_lag=4, batch=100) == 500
    assert pacing.window(max_lag=0, batch=0) == 1


def test_batch_samples_from_tokens_or_override() -> None:
    assert pacing.batch_samples(1280, 10.0, None) == 128
    assert pacing.batch_samples(1280, None, None) == 1  # nothing sampled yet
    assert pacing.batch_samples(1280, 10.0, 7) == 7
    assert pacing.batch_samples(5, 10.0, None) == 1


@pytest.mark.parametrize(
    ("group", "published", "consumed", "window", "ok"),
    [
        (8, 0, 0, 40, True),
        (8, 32, 0, 40, True),  # 32 + 8 = 40 fits exactly
        (8, 33, 0, 40, False),
        (8, 100, 70, 40, True),
        (8, 100, 50, 40, False),
        (64, 10, 10, 40, True),  # a group larger than the window: only when caught up
        (64, 11, 10, 40, False),
    ],
)
def test_may_start(group: int, published: int, consumed: int, window: int, ok: bool) -> None:
    assert pacing.may_start(group, pacing.outstanding(published, 0, 0, consumed), window) is ok


def test_never_more_than_window_ahead_when_groups_fit() -> None:
    """Simulated: a generator that asks before each group never has more than the window
    outstanding, whatever the learner's pace."""
    window, group, published, consumed = 40, 8, 0, 0
    for tick in range(1000):
        if pacing.may_start(group, pacing.outstanding(published, 0, 0, consumed), window):
            published += group
        if tick % 3 == 0:
            consumed = min(published, consumed + 5)
        assert published - consumed <= window


def test_running_mean_follows_recent_values() -> None:
    m = pacing.RunningMean(decay=0.5)
    assert m.value is None
    for v in (10, 10, 10, 100, 100, 100, 100, 100, 100, 100):
        m.add(v)
    assert m.value is not None and m.value > 95


# -- trajectories -----------------------------------------------------------------------


def turn(tokens: list[int], version: int, text: str = "t") -> episode.Turn:
    return episode.Turn(tokens, [-0.5] * len(tokens), version, text, "stop")


def test_single_turn_trajectory_carries_logprobs_versions_and_no_mask() -> None:
    t = episode.trajectory(
        TASK, group_id="g1", index=2, prompt_ids=[256, 65], prompt_text="A",
        parts=[turn([66, 67, 257], 5, "BC")], generator_id="gen-0",
    )  # fmt: skip
    assert (t.group_id, t.index, t.group_size, t.suite) == ("g1", 2, 4, "pyfunc")
    assert list(unpack_i32(t.completion_tokens)) == [66, 67, 257]
    assert list(unpack_i32(t.policy_versions)) == [5, 5, 5]
    assert list(unpack_f32(t.behaviour_logprobs or b"")) == [-0.5] * 3
    assert t.completion_mask is None and t.policy_version == 5 and t.turns == 1
    assert t.completion == "BC" and t.verifier == TASK.verifier
    assert [m.role for m in t.messages] == ["user", "assistant"]
    assert codec.decode(codec.encode(t)) == t


def test_multi_turn_trajectory_masks_observations_and_keeps_per_turn_versions() -> None:
    parts: list[episode.Part] = [
        turn([1, 2], 3, "first"),
        episode.Observation([9, 9, 9], "obs"),
        turn([4], 4, "second"),
    ]
    t = episode.trajectory(
        TASK, group_id="g", index=0, prompt_ids=[256], prompt_text="p", parts=parts,
        generator_id="x", finish_reason="turn_limit", trajectory_id="traj-1",
    )  # fmt: skip
    assert t.id == "traj-1"
    assert t.completion_mask == bytes([1, 1, 0, 0, 0, 1])
    assert list(unpack_i32(t.policy_versions)) == [3, 3, -1, -1, -1, 4]
    assert list(unpack_f32(t.behaviour_logprobs or b"")) == [-0.5, -0.5, 0, 0, 0, -0.5]
    assert t.policy_version == 3 and t.turns == 2 and t.completion == "second"
    assert t.finish_reason == "turn_limit"
    assert [m.role for m in t.messages] == ["user", "assistant", "user", "assistant"]


def test_an_episode_must_start_with_a_turn_of_consistent_length() -> None:
    with pytest.raises(ValueError, match="starts with an assistant turn"):
        episode.trajectory(
            TASK, group_id="g", index=0, prompt_ids=[1], prompt_text="",
            parts=[episode.Observation([1], "o")], generator_id="x",
        )  # fmt: skip
    bad = episode.Turn([1, 2], [-1.0], 0, "", "stop")
    with pytest.raises(ValueError, match="logprobs"):
        episode.trajectory(
            TASK, group_id="g", index=0, prompt_ids=[1], prompt_text="", parts=[bad],
            generator_id="x",
        )  # fmt: skip


def test_observation_text_reports_the_verdict_bounded() -> None:
    result = SandboxResult(
        request_id="r", trajectory_id="t", group_id="g", outcome=Outcome.FAILED,
        passed=1, total=4, detail="test_1: assert 3 == 4" * 50,
    )  # fmt: skip
    text = episode.observation_text(result, max_chars=60)
    assert text.startswith("\n# sandbox: failed: 1/4 tests passed; test_1")
    assert len(text) <= 60 + len("\n# sandbox: \n")
    assert "did not answer" in episode.observation_text(None, 100)


# -- weights ----------------------------------------------------------------------------


def test_state_problem_checks_names_and_shapes() -> None:
    import torch

    shapes = {"a": (2, 3), "b": (4,)}
    ok = {"a": torch.zeros(2, 3), "b": torch.zeros(4)}
    assert state_problem(shapes, ok) is None
    assert "missing ['b']" in (state_problem(shapes, {"a": torch.zeros(2, 3)}) or "")
    assert "shape (3, 2)" in (state_problem(shapes, {**ok, "a": torch.zeros(3, 2)}) or "")


def test_byte_codec_round_trip() -> None:
    from learner.tiny import ByteTokenizer
    from services.rollout.textcodec import for_policy

    class P:
        tokenizer = ByteTokenizer()

    text = for_policy(P())
    ids = text.prompt_ids(TASK)
    assert ids[0] == ByteTokenizer.bos_id and text.text(ids) == TASK.prompt
    assert text.text([*text.ids("x+3"), ByteTokenizer.eos_id]) == "x+3"


def test_no_stall_escape_a_still_learner_holds_the_generators() -> None:
    """The stall escape (generator.pace_stall_s) is gone: the learner's count moves on
    drops too, so a full window only opens when the learner settles samples."""
    assert not pacing.may_start(8, pacing.outstanding(100, 0, 0, 0), 40)
    assert pacing.may_start(8, pacing.outstanding(60, 0, 40, 70), 40)  # 30 + 8 fits
