"""The dispatcher's group state machine (streams/groups.py), pure."""

from __future__ import annotations

import math

import pytest

from schemas import codec
from schemas.rollout import Trajectory
from schemas.sandbox import Outcome, SandboxResult, VerifierSpec
from streams import groups
from streams.config import DispatcherSettings
from streams.groups import GroupState, Policy, Score

POLICY = Policy.from_section(
    DispatcherSettings(
        request_deadline_s=10, max_attempts=3, group_deadline_s=100, tombstone_ttl_s=50
    )
)


def traj(group: str = "g1", index: int = 0, size: int = 4, sandbox: bool = True) -> Trajectory:
    verifier = VerifierSpec(name="python_tests", tests="def test_a(): pass", needs_sandbox=sandbox)
    return Trajectory(
        task_id="task",
        group_id=group,
        group_size=size,
        index=index,
        verifier=verifier,
        completion=f"here:\n```python\ndef f():\n    return {index}\n```\n",
    )


def result_for(t: Trajectory, outcome: Outcome, passed: int, total: int, attempt: int = 0):
    return SandboxResult(
        request_id=f"{t.id}:req",
        attempt=attempt,
        trajectory_id=t.id,
        group_id=t.group_id,
        outcome=outcome,
        passed=passed,
        total=total,
    )


def score_result(r: SandboxResult) -> Score:
    if r.outcome == Outcome.SANDBOX_ERROR:
        return Score(outcome=r.outcome, masked=True, mask_reason="sandbox_error")
    frac = r.passed / r.total if r.total else 0.0
    return Score(outcome=r.outcome, reward=frac, passed=r.passed, total=r.total)


def inline(t: Trajectory) -> Score | None:
    if t.verifier.needs_sandbox:
        return None
    return Score(outcome=Outcome.PASSED, reward=1.0 if t.index % 2 else 0.0)


def add(state: GroupState | None, t: Trajectory, now: float = 0.0):
    return groups.on_trajectory(state, t, codec.encode(t), now, POLICY, inline(t))


def test_extract_code() -> None:
    assert groups.extract_code("```python\nx = 1\n```") == "x = 1"
    assert groups.extract_code("a\n```\ny = 2\n```\nb\n```py\nz = 3\n```") == "z = 3"
    assert groups.extract_code("  plain = 1  ") == "plain = 1"
    assert groups.extract_code("unclosed ```python\nx") == "unclosed ```python\nx"


def test_advantages_normalised_and_all_equal_zero() -> None:
    adv = groups.group_advantages([1.0, 0.0, 1.0, 0.0])
    assert adv == [1.0, -1.0, 1.0, -1.0]
    assert groups.group_advantages([0.5] * 8) == [0.0] * 8
    assert groups.group_advantages([1.0]) == [0.0]
    adv = groups.group_advantages([0.0, 0.25, 1.0])
    assert math.isclose(sum(adv), 0.0, abs_tol=1e-9)
    assert math.isclose(sum(a * a for a in adv) / 3, 1.0, rel_tol=1e-9)


def test_complete_group_is_emitted_once_with_advantages() -> None:
    members = [traj(index=i) for i in range(4)]
    state = None
    requests = []
    for t in members:
        state, fx = add(state, t)
        requests += fx.requests
        assert not fx.rewards
    assert [r.trajectory_id for r in requests] == [t.id for t in members]
    assert all(r.code.startswith("def f()") for r in requests)
    outcomes = [(4, 4), (0, 4), (2, 4), (4, 4)]
    emitted = []
    for t, (p, n) in zip(members, outcomes, strict=True):
        outcome = Outcome.PASSED if p == n else Outcome.FAILED
        state, fx = groups.on_result(state, result_for(t, outcome, p, n), 1.0, POLICY, score_result)
        emitted += fx.rewards
    assert len(emitted) == 4
    by_id = {s.trajectory.id: s for s in emitted}
    expected = groups.group_advantages([1.0, 0.0, 0.5, 1.0])
    for t, adv in zip(members, expected, strict=True):
        assert by_id[t.id].advantage == pytest.approx(adv)
        assert by_id[t.id].id == groups.scored_id(t.id)
        assert by_id[t.id].group_size_scored == 4
    # Redeliveries of anything change nothing.
    assert state is not None and state.emitted_at == 1.0
    for t in members:
        state, fx = add(state, t, 2.0)
        assert not (fx.rewards or fx.requests or fx.ledger)
        state, fx = groups.on_result(
            state, result_for(t, Outcome.PASSED, 4, 4), 2.0, POLICY, score_result
        )
        assert not fx.rewards


def test_duplicate_and_stale_results_are_ignored() -> None:
    a, b = traj(index=0, size=2), traj(index=1, size=2)
    state, _ = add(None, a)
    state, _ = add(state, b)
    state, fx = groups.on_result(
        state, result_for(a, Outcome.PASSED, 1, 1), 1, POLICY, score_result
    )
    state, fx = groups.on_result(
        state, result_for(a, Outcome.FAILED, 0, 1), 1, POLICY, score_result
    )
    assert not fx.rewards
    stale = result_for(b, Outcome.PASSED, 1, 1, attempt=1)  # an attempt never sent
    state, fx = groups.on_result(state, stale, 1, POLICY, score_result)
    assert not fx.rewards
    state, fx = groups.on_result(
        state, result_for(b, Outcome.FAILED, 0, 1), 1, POLICY, score_result
    )
    assert {s.trajectory.id: s.reward for s in fx.rewards} == {a.id: 1.0, b.id: 0.0}


def test_sandbox_error_is_retried_then_masked() -> None:
    a, b = traj(index=0, size=2), traj(index=1, size=2)
    state, _ = add(None, a)
    state, _ = add(state, b)
    for attempt in range(POLICY.max_attempts - 1):
        err = result_for(a, Outcome.SANDBOX_ERROR, 0, 0, attempt=attempt)
        state, fx = groups.on_result(state, err, 1, POLICY, score_result)
        assert [r.attempt for r in fx.requests] == [attempt + 1]
        assert fx.requests[0].request_id == f"{a.id}:req"
    last = result_for(a, Outcome.SANDBOX_ERROR, 0, 0, attempt=POLICY.max_attempts - 1)
    state, fx = groups.on_result(state, last, 1, POLICY, score_result)
    assert not fx.requests and not fx.rewards
    state, fx = groups.on_result(
        state, result_for(b, Outcome.PASSED, 1, 1), 1, POLICY, score_result
    )
    by_id = {s.trajectory.id: s for s in fx.rewards}
    assert by_id[a.id].masked and by_id[a.id].advantage == 0.0 and by_id[a.id].mask_reason
    assert not by_id[b.id].masked and by_id[b.id].group_size_scored == 1


def test_missing_result_retried_by_deadline_then_masked() -> None:
    a = traj(index=0, size=1)
    state, _ = add(None, a, now=0.0)
    assert not groups.is_due(state, 5.0, POLICY)
    assert groups.is_due(state, 11.0, POLICY)
    state, fx = groups.on_tick(state, 11.0, POLICY)
    assert [r.attempt for r in fx.requests] == [1]
    state, fx = groups.on_tick(state, 22.0, POLICY)
    assert [r.attempt for r in fx.requests] == [2]
    state, fx = groups.on_tick(state, 33.0, POLICY)
    assert not fx.requests
    assert len(fx.rewards) == 1 and fx.rewards[0].masked
    assert "3 attempts" in fx.rewards[0].mask_reason


def test_partial_group_emitted_at_deadline_and_late_member_dropped() -> None:
    members = [traj(index=i, size=4) for i in range(3)]
    state = None
    for t in members:
        state, _ = add(state, t, 0.0)
    for i, t in enumerate(members):
        r = result_for(t, Outcome.PASSED if i else Outcome.FAILED, i and 1, 1)
        state, fx = groups.on_result(state, r, 1.0, POLICY, score_result)
        assert not fx.rewards
    assert state is not None
    state, fx = groups.on_tick(state, 101.0, POLICY)
    assert len(fx.rewards) == 3 and {s.group_size_scored for s in fx.rewards} == {3}
    late = traj(index=3, size=4)
    state, fx = add(state, late, 102.0)
    assert not fx.rewards and len(fx.ledger) == 1
    assert fx.ledger[0].status == "dropped" and "late" in fx.ledger[0].reason
    state, fx = groups.on_tick(state, 160.0, POLICY)
    assert fx.delete


def test_inline_verifier_needs_no_sandbox() -> None:
    members = [traj(index=i, size=2, sandbox=False) for i in range(2)]
    state, fx = add(None, members[0])
    assert not fx.requests and not fx.rewards
    state, fx = add(state, members[1])
    assert sorted(s.reward for s in fx.rewards) == [0.0, 1.0]
    assert sorted(s.advantage for s in fx.rewards) == [-1.0, 1.0]


def test_inline_verifier_without_score_is_an_error() -> None:
    t = traj(index=0, size=1, sandbox=False)
    with pytest.raises(ValueError, match="needs no sandbox"):
        groups.on_trajectory(None, t, codec.encode(t), 0.0, POLICY, None)
