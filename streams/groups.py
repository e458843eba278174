"""The reward dispatcher's state machine for one advantage group, as pure functions.

A group is the `group_size` trajectories sampled together for one task. Each member is
scored (in the sandbox tier, or in-process for verifiers that need none); when every
member is scored, or the group's deadline passes, the group is emitted: one
ScoredTrajectory per scored member, with a group-relative advantage. streams/dispatcher.py
feeds every event of a group (trajectories, sandbox results, ticks) through one of these
functions, one event at a time, and carries out the Effects.

- Join: a result counts only for the member's outstanding request, matched on
  (request_id, attempt). Other requests of the same trajectory (multi-turn feedback runs,
  `{tid}:turn{n}`) are ignored. A verdict of the scoring request that arrives before its
  trajectory is kept and reused (no second run).
- The table value is small: per member its wire bytes when small, else a claim-check
  reference (`Member.ref`), and the join fields. Retries and rewards that need the whole
  trajectory are returned as Retry and Emission; the caller resolves the reference.
- Fates: at most `group_size` members; any other trajectory of the group (over size, late,
  or too old to have a group) gets a DROPPED ledger entry with a deterministic id.
- Idempotency: a redelivered trajectory, a duplicate or stale result and anything for an
  emitted group change nothing and emit nothing twice. Emitted groups keep a tombstone
  (member ids) until `tombstone_ttl_s` has passed; a trajectory older than that whose
  group is unknown is dropped (its group may have been emitted and forgotten).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import msgspec

from schemas import codec
from schemas.learning import LedgerEntry
from schemas.rollout import ScoredTrajectory, Trajectory
from schemas.sandbox import Outcome, SandboxRequest, SandboxResult
from streams.members import (
    Policy,
    Score,
    dropped,
    extract_code,
    group_advantages,
    request_for,
    scored,
    scored_id,
    scoring_request_id,
)

if TYPE_CHECKING:
    pass

__all__ = [
    "Policy",
    "Score",
    "extract_code",
    "group_advantages",
    "request_for",
    "scored_id",
    "scoring_request_id",
]


class Member(msgspec.Struct, kw_only=True):
    """One trajectory of the group and where its scoring stands."""

    ref: bytes = msgspec.field(name="trajectory")
    """The trajectory's wire bytes, or an encoded BlobRef to them (large trajectories).
    Stored under the old name, so table values written before still decode."""
    request_id: str = ""
    attempt: int = 0
    sent_at: float = 0.0
    score: Score | None = None


class GroupState(msgspec.Struct, kw_only=True):
    """Table value, keyed by group_id (co-partitioned with trajectories and results)."""

    group_id: str
    group_size: int
    first_seen: float
    members: dict[str, Member] = msgspec.field(default_factory=dict)
    early: dict[str, Score] = msgspec.field(default_factory=dict)
    """Scores of scoring requests whose trajectory has not arrived yet."""
    emitted_at: float | None = None
    emitted_ids: list[str] = msgspec.field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Retry:
    """A request to send again: the member's trajectory (`ref`) at `attempt`."""

    ref: bytes
    attempt: int


@dataclass(frozen=True, slots=True)
class Emission:
    """One reward to publish once the member's trajectory (`ref`) is resolved."""

    ref: bytes
    score: Score
    advantage: float
    n_live: int
    dispatcher_id: str
    now: float

    def reward(self, traj: Trajectory) -> ScoredTrajectory:
        return scored(traj, self.score, self.advantage, self.n_live, self.dispatcher_id, self.now)


@dataclass
class Effects:
    """What the caller must do after a transition, in order: requests (new ones, then
    retries), rewards, ledger entries."""

    new_requests: list[SandboxRequest] = field(default_factory=list)
    retries: list[Retry] = field(default_factory=list)
    emissions: list[Emission] = field(default_factory=list)
    ledger: list[LedgerEntry] = field(default_factory=list)
    """Only for trajectories that never reach `rewards` (the learner records the rest)."""
    delete: bool = False
    """Remove the group from the table (its tombstone expired)."""
    policy: Policy | None = None

    @property
    def requests(self) -> list[SandboxRequest]:
        """All requests, retries built from inline refs (a BlobRef ref needs `realize`)."""
        policy = self.policy
        if policy is None:
            return list(self.new_requests)
        return self.new_requests + [
            request_for(inline(r.ref), r.attempt, policy) for r in self.retries
        ]

    @property
    def rewards(self) -> list[ScoredTrajectory]:
        """The rewards, built from inline refs (a BlobRef ref needs the caller's resolve)."""
        return [e.reward(inline(e.ref)) for e in self.emissions]


def inline(ref: bytes) -> Trajectory:
    """The trajectory of an inline ref (raises SchemaError for a BlobRef)."""
    return codec.decode(ref, Trajectory)


ScoreResult = Callable[[SandboxResult], Score]
"""Turns a sandbox result into a Score through the reward map."""
ScoreInline = Callable[[Trajectory], Awaitable[Score]]
"""Scores a trajectory whose verifier needs no sandbox (the agent awaits it and passes the
Score to on_trajectory)."""


def on_trajectory(
    state: GroupState | None,
    traj: Trajectory,
    raw: bytes,
    now: float,
    policy: Policy,
    inline: Score | None = None,
    dispatcher_id: str = "",
) -> tuple[GroupState | None, Effects]:
    """A trajectory arrived (`raw`: its ref to keep): ask the sandbox for its score (or
    take `inline`, its in-process score, required when the verifier needs no sandbox, or
    an early verdict of its scoring request); maybe emit."""
    effects = Effects(policy=policy)
    if state is None and now - traj.created_at > policy.tombstone_ttl_s:
        why = "stale: older than the tombstone TTL, its group may be emitted and forgotten"
        effects.ledger.append(dropped(traj.id, traj.group_id, why))
        return None, effects
    if not traj.verifier.needs_sandbox and inline is None:
        raise ValueError(f"{traj.verifier.name} needs no sandbox: pass its inline score")
    if state is None:
        state = GroupState(group_id=traj.group_id, group_size=traj.group_size, first_seen=now)
    if not state.members and state.emitted_at is None:
        state.first_seen, state.group_size = now, traj.group_size  # its first member
    if state.emitted_at is not None:
        if traj.id not in state.emitted_ids:
            effects.ledger.append(dropped(traj.id, traj.group_id, "late: its group was emitted"))
        return state, effects
    if traj.id in state.members:
        return state, effects  # redelivery
    if len(state.members) >= state.group_size:
        why = f"over size: its group already has {state.group_size} members"
        effects.ledger.append(dropped(traj.id, traj.group_id, why))
        return state, effects
    member = Member(ref=raw, sent_at=now)
    state.members[traj.id] = member
    early = state.early.pop(traj.id, None)
    if inline is not None and not traj.verifier.needs_sandbox:
        member.score = inline
    elif early is not None:
        member.request_id, member.score = scoring_request_id(traj.id), early
    else:
        request = request_for(traj, 0, policy)
        member.request_id = request.request_id
        effects.new_requests.append(request)
    _maybe_emit(state, now, policy, effects, dispatcher_id)
    return state, effects


def on_result(
    state: GroupState | None,
    result: SandboxResult,
    now: float,
    policy: Policy,
    score_result: ScoreResult,
    dispatcher_id: str = "",
) -> tuple[GroupState | None, Effects]:
    """A sandbox result arrived: record it if it answers the member's outstanding request
    (request_id and attempt), or retry a sandbox_error; maybe emit."""
    effects = Effects(policy=policy)
    if state is not None and state.emitted_at is not None:
        return state, effects  # a finished group: a late duplicate
    tid = result.trajectory_id
    member = state.members.get(tid) if state is not None else None
    if member is None:
        return _early(state, result, now, score_result), effects
    assert state is not None
    if member.score is not None or result.request_id != member.request_id:
        return state, effects  # duplicate, or another request of this trajectory
    if result.attempt != member.attempt:
        return state, effects  # a stale attempt
    if result.outcome == Outcome.SANDBOX_ERROR and member.attempt + 1 < policy.max_attempts:
        _retry(member, now, effects)
    else:
        member.score = score_result(result)
    _maybe_emit(state, now, policy, effects, dispatcher_id)
    return state, effects


def _early(
    state: GroupState | None, result: SandboxResult, now: float, score_result: ScoreResult
) -> GroupState | None:
    """Keep a scoring verdict that came before its trajectory; ignore anything else."""
    tid = result.trajectory_id
    usable = result.outcome != Outcome.SANDBOX_ERROR and result.attempt == 0
    if result.request_id != scoring_request_id(tid) or not usable:
        return state
    if state is None:
        state = GroupState(group_id=result.group_id, group_size=0, first_seen=now)
    state.early.setdefault(tid, score_result(result))
    return state


def on_tick(
    state: GroupState, now: float, policy: Policy, dispatcher_id: str = ""
) -> tuple[GroupState, Effects]:
    """Deadlines: retry or mask members whose result is overdue; emit a late group;
    expire an old tombstone (or early verdicts whose trajectory never came)."""
    effects = Effects(policy=policy)
    if state.emitted_at is not None:
        effects.delete = now - state.emitted_at > policy.tombstone_ttl_s
        return state, effects
    if not state.members:
        effects.delete = now - state.first_seen > policy.tombstone_ttl_s
        return state, effects
    for member in state.members.values():
        if member.score is None and now - member.sent_at > policy.request_deadline_s:
            if member.attempt + 1 < policy.max_attempts:
                _retry(member, now, effects)
            else:
                member.score = Score(
                    outcome=Outcome.SANDBOX_ERROR,
                    masked=True,
                    mask_reason=f"no sandbox result after {member.attempt + 1} attempts",
                )
    _maybe_emit(state, now, policy, effects, dispatcher_id)
    return state, effects


def next_due(state: GroupState, policy: Policy) -> float:
    """When on_tick will next change something (the timer ticks a group only then)."""
    if state.emitted_at is not None:
        return state.emitted_at + policy.tombstone_ttl_s
    if not state.members:
        return state.first_seen + policy.tombstone_ttl_s
    pending = [m.sent_at + policy.request_deadline_s for m in state.members.values() if not m.score]
    if pending:
        return min(pending)
    return state.first_seen + policy.group_deadline_s


def is_due(state: GroupState, now: float, policy: Policy) -> bool:
    """Whether on_tick would change anything (the timer sends ticks only for these)."""
    return now > next_due(state, policy)


def _retry(member: Member, now: float, effects: Effects) -> None:
    member.attempt += 1
    member.sent_at = now
    effects.retries.append(Retry(member.ref, member.attempt))


def _maybe_emit(
    state: GroupState, now: float, policy: Policy, effects: Effects, dispatcher_id: str
) -> None:
    scored_all = all(m.score is not None for m in state.members.values())
    complete = len(state.members) >= state.group_size
    late = now - state.first_seen > policy.group_deadline_s
    if not scored_all or not (complete or late):
        return
    members = sorted(state.members.items())
    live = [m.score.reward for _, m in members if m.score and not m.score.masked]
    advantages = iter(group_advantages(live))
    for _, member in members:
        score = member.score
        assert score is not None
        advantage = 0.0 if score.masked else next(advantages)
        # Masked samples travel to the learner too: it records them in the ledger, so every
        # trajectory that reaches `rewards` gets exactly one ledger entry, from the learner.
        effects.emissions.append(
            Emission(member.ref, score, advantage, len(live), dispatcher_id, now)
        )
    state.emitted_at = now
    state.emitted_ids = [tid for tid, _ in members]
    state.members = {}
    state.early = {}
