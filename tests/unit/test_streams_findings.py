"""The findings of issue 13 as pure state-machine cases (streams/groups.py): a result of
another request of the same trajectory, a group over size, redelivered late members, and
events of one group interleaved in any order across its topics."""

from __future__ import annotations

import random

from schemas import codec
from schemas.rollout import Trajectory
from schemas.sandbox import Outcome, SandboxResult
from streams import groups
from streams.groups import GroupState

from .test_streams_groups import POLICY, add, result_for, score_result, traj


def turn_result(t: Trajectory, turn: int, outcome: Outcome, passed: int) -> SandboxResult:
    """A multi-turn feedback run's verdict: same trajectory, attempt 0, its own request."""
    return SandboxResult(
        request_id=f"{t.id}:turn{turn}",
        attempt=0,
        trajectory_id=t.id,
        group_id=t.group_id,
        turn=turn,
        outcome=outcome,
        passed=passed,
        total=2,
    )


def on_result(state: GroupState | None, r: SandboxResult, now: float = 1.0):
    return groups.on_result(state, r, now, POLICY, score_result)


def test_a_result_of_another_request_never_becomes_the_score() -> None:
    t = traj(index=0, size=1)
    state, fx = add(None, t)
    assert [r.request_id for r in fx.requests] == [f"{t.id}:req"]
    state, fx = on_result(state, turn_result(t, 2, Outcome.PASSED, 2))  # a late turn verdict
    assert not fx.rewards and not fx.requests
    state, fx = on_result(state, result_for(t, Outcome.FAILED, 0, 2))
    assert [(s.trajectory.id, s.reward, s.outcome) for s in fx.rewards] == [
        (t.id, 0.0, Outcome.FAILED)
    ]


def test_a_scoring_verdict_that_came_first_is_reused_not_rerun() -> None:
    """A producer that ran the scoring spec on the final code under the scoring request id
    (before the trajectory was published): its verdict is the score; nothing is re-run."""
    a, b = traj(index=0, size=2), traj(index=1, size=2)
    state, fx = on_result(None, result_for(a, Outcome.PASSED, 2, 2))
    assert not fx.rewards and not fx.requests
    state, fx = add(state, a)
    assert not fx.requests, "a passed final turn was run again"
    state, fx = add(state, b)
    assert [r.trajectory_id for r in fx.requests] == [b.id]
    state, fx = on_result(state, result_for(b, Outcome.FAILED, 0, 2))
    assert {s.trajectory.id: s.reward for s in fx.rewards} == {a.id: 1.0, b.id: 0.0}


def test_a_group_never_grows_over_its_size() -> None:
    members = [traj(index=i, size=2) for i in range(2)]
    resample = traj(index=0, size=2)  # a redelivered task's resample: a new id, same group
    state = None
    for t in [*members, resample]:
        state, fx = add(state, t)
    assert [e.trajectory_id for e in fx.ledger] == [resample.id]
    assert fx.ledger[0].status == "dropped" and "over size" in fx.ledger[0].reason
    assert not fx.requests
    rewards = []
    for t in members:
        state, fx = on_result(state, result_for(t, Outcome.PASSED, 1, 1))
        rewards += fx.rewards
    assert sorted(s.trajectory.id for s in rewards) == sorted(t.id for t in members)
    assert {s.group_size_scored for s in rewards} == {2}


def test_redelivered_late_and_extra_members_have_one_fate_each() -> None:
    a, b = traj(index=0, size=2), traj(index=1, size=2)
    extra, late = traj(index=0, size=2), traj(index=1, size=2)  # resamples: new ids
    state, _ = add(None, a)
    state, _ = add(state, b)
    fates = []
    for _ in range(3):  # the extra member, redelivered
        state, fx = add(state, extra)
        fates += fx.ledger
    for t in (a, b):
        state, _ = on_result(state, result_for(t, Outcome.PASSED, 1, 1))
    for _ in range(3):  # the late one, redelivered
        state, fx = add(state, late, 5.0)
        fates += fx.ledger
    assert len({e.id for e in fates if e.trajectory_id == extra.id}) == 1
    assert len({e.id for e in fates if e.trajectory_id == late.id}) == 1
    from streams.members import fate_id

    assert {e.id for e in fates} == {fate_id(extra.id), fate_id(late.id)}


def test_interleaved_events_of_a_group_in_any_order() -> None:
    """Trajectories (and their redeliveries), the dispatcher's own results, turn verdicts
    and a duplicate, in many orders: one reward per member, always the scoring verdict."""
    members = [traj(index=i, size=3) for i in range(3)]
    verdict = {
        m.id: (Outcome.PASSED, 2) if i % 2 else (Outcome.FAILED, 0) for i, m in enumerate(members)
    }
    rng = random.Random(13)
    for _ in range(60):
        arrivals = [("t", m) for m in members] + [("t", rng.choice(members))]
        shuffled = rng.sample(arrivals, len(arrivals))
        state, rewards, pending = None, [], []
        for _, m in shuffled:
            state, fx = add(state, m)
            rewards += fx.rewards
            pending += [r.trajectory_id for r in fx.requests]
            # A turn verdict (the opposite of the score) and the dispatcher's result for
            # whatever is pending, interleaved at random with the next arrival.
            by_id = {x.id: x for x in members}
            for tid in rng.sample(pending, len(pending)):
                outcome, passed = verdict[tid]
                wrong = Outcome.PASSED if outcome == Outcome.FAILED else Outcome.FAILED
                for r in (
                    turn_result(by_id[tid], 1, wrong, 2 - passed),
                    result_for(by_id[tid], outcome, passed, 2),
                ):
                    state, fx = on_result(state, r)
                    rewards += fx.rewards
            pending = []
        assert sorted(s.trajectory.id for s in rewards) == sorted(m.id for m in members)
        for s in rewards:
            assert (s.outcome, s.passed) == verdict[s.trajectory.id]


def test_stale_trajectory_of_a_forgotten_group_is_dropped() -> None:
    old = traj(index=0, size=2)
    old = Trajectory(**{**{f: getattr(old, f) for f in old.__struct_fields__}, "created_at": 0.0})
    state, fx = groups.on_trajectory(None, old, codec.encode(old), 10_000.0, POLICY)
    assert state is None and not fx.requests
    assert [e.reason.split(":")[0] for e in fx.ledger] == ["stale"]


def test_deadlines_tick_only_when_something_changes() -> None:
    """A group waiting for its results is not due until a request deadline passes; after
    a retry it is not due again until the next one (no ticks while waiting)."""
    a = traj(index=0, size=2)
    state, _ = add(None, a, 0.0)
    assert state is not None
    assert not groups.is_due(state, 9.0, POLICY) and groups.is_due(state, 10.5, POLICY)
    state, fx = groups.on_tick(state, 10.5, POLICY)
    assert [r.attempt for r in fx.requests] == [1]
    assert not groups.is_due(state, 20.0, POLICY)
    state, fx = on_result(state, result_for(a, Outcome.PASSED, 1, 1, attempt=1))
    # Scored, incomplete: nothing is due until the group deadline.
    assert not groups.is_due(state, 99.0, POLICY) and groups.is_due(state, 100.5, POLICY)


def test_no_tick_storm_past_the_group_deadline() -> None:
    """Past its group deadline, a group waiting for a result sent recently is not due
    (old code ticked it every interval until the result came, changing nothing)."""
    a, b = traj(index=0, size=3), traj(index=1, size=3)
    state, _ = add(None, a, 0.0)
    state, _ = on_result(state, result_for(a, Outcome.PASSED, 1, 1), 1.0)
    state, _ = add(state, b, 95.0)
    assert state is not None
    assert not groups.is_due(state, 101.0, POLICY)
    state, fx = groups.on_tick(state, 101.0, POLICY)
    assert not (fx.requests or fx.rewards)
    assert groups.is_due(state, 105.5, POLICY)
