"""The reward dispatcher's state machine for one advantage group, as pure functions.

A group is the `group_size` trajectories sampled together for one task. Each member is
scored (in the sandbox tier, or in-process for verifiers that need none); when every
member is scored, or the group's deadline passes, the group is emitted: one
ScoredTrajectory per scored member, with a group-relative advantage. The faust agents in
streams/app.py only load a GroupState from the table, call one function here and carry
out the Effects it returns.

Idempotency: a redelivered trajectory (same id), a duplicate or stale result (same
request and attempt, or an older attempt) and anything arriving for an emitted group
change nothing and emit nothing twice. Emitted groups keep a small tombstone (member
ids only) until `tombstone_ttl_s` has passed.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import msgspec

from schemas import codec
from schemas.learning import LedgerEntry, LedgerStatus
from schemas.rollout import ScoredTrajectory, Trajectory
from schemas.sandbox import Outcome, SandboxRequest, SandboxResult

if TYPE_CHECKING:
    from streams.config import DispatcherSettings


class Score(msgspec.Struct, kw_only=True):
    """What one member earned: from a sandbox result or an in-process verifier."""

    outcome: Outcome
    reward: float = 0.0
    passed: int = 0
    total: int = 0
    masked: bool = False
    mask_reason: str = ""
    components: dict[str, float] = msgspec.field(default_factory=dict)
    verifier_name: str = ""
    verifier_version: str = ""
    image_digest: str = ""


class Member(msgspec.Struct, kw_only=True):
    """One trajectory of the group and where its scoring stands."""

    trajectory: bytes
    """The trajectory's wire bytes, re-embedded into its ScoredTrajectory."""
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
    emitted_at: float | None = None
    emitted_ids: list[str] = msgspec.field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Policy:
    """Dispatcher timing and retry rules: `from_section(settings.dispatcher)` (the section
    holds the defaults and the docs of each field)."""

    request_deadline_s: float
    """A sandbox result missing this long after its request is retried."""
    max_attempts: int
    """Attempts per request (sandbox_error or a missing result) before masking."""
    group_deadline_s: float
    """A group still incomplete this long after its first member is emitted partially."""
    tombstone_ttl_s: float
    """How long an emitted group's member ids are kept to reject redeliveries."""
    timeout_s: float
    """Sandbox wall-clock limit per job."""
    memory_mb: int
    """Sandbox memory limit per job."""

    @classmethod
    def from_section(cls, d: DispatcherSettings) -> Policy:
        return cls(
            request_deadline_s=d.request_deadline_s,
            max_attempts=d.max_attempts,
            group_deadline_s=d.group_deadline_s,
            tombstone_ttl_s=d.tombstone_ttl_s,
            timeout_s=d.sandbox_timeout_s,
            memory_mb=d.sandbox_memory_mb,
        )


@dataclass
class Effects:
    """What the agent must do after a transition, in order."""

    requests: list[SandboxRequest] = field(default_factory=list)
    rewards: list[ScoredTrajectory] = field(default_factory=list)
    ledger: list[LedgerEntry] = field(default_factory=list)
    """Only for trajectories that never reach `rewards` (the learner records the rest)."""
    delete: bool = False
    """Remove the group from the table (its tombstone expired)."""


ScoreResult = Callable[[SandboxResult], Score]
"""Turns a sandbox result into a Score through the reward map."""
ScoreInline = Callable[[Trajectory], Awaitable[Score]]
"""Scores a trajectory whose verifier needs no sandbox (the agent awaits it and passes the
Score to on_trajectory)."""


def extract_code(completion: str) -> str:
    """The candidate's code: the last fenced block (```python or ```), else the whole text."""
    marker = "```"
    end = completion.rfind(marker)
    if end <= 0:
        return completion.strip()
    start = completion.rfind(marker, 0, end)
    if start < 0:
        return completion.strip()
    body = completion[start + len(marker) : end]
    first_newline = body.find("\n")
    if first_newline >= 0 and body[:first_newline].strip().isidentifier():
        body = body[first_newline + 1 :]  # drop the language tag
    return body.strip("\n")


def group_advantages(rewards: list[float], eps: float = 1e-6) -> list[float]:
    """Group-relative advantages: (r - mean) / std (population std).

    All-equal rewards (every sample passed, or every one failed) give 0 for all: such a
    group carries no signal about which sample was better. A group of one gives 0.
    """
    n = len(rewards)
    if n < 2:
        return [0.0] * n
    mean = sum(rewards) / n
    std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / n)
    if std < eps:
        return [0.0] * n
    return [(r - mean) / std for r in rewards]


def request_for(traj: Trajectory, attempt: int, policy: Policy) -> SandboxRequest:
    return SandboxRequest(
        request_id=f"{traj.id}:req",
        attempt=attempt,
        trajectory_id=traj.id,
        group_id=traj.group_id,
        task_id=traj.task_id,
        code=extract_code(traj.completion),
        verifier=traj.verifier,
        timeout_s=policy.timeout_s,
        memory_mb=policy.memory_mb,
        origin=traj.origin,
        parent_id=traj.id,
    )


def on_trajectory(
    state: GroupState | None,
    traj: Trajectory,
    raw: bytes,
    now: float,
    policy: Policy,
    inline: Score | None = None,
    dispatcher_id: str = "",
) -> tuple[GroupState, Effects]:
    """A trajectory arrived: ask the sandbox for its score, or take `inline` (its score from
    an in-process verifier, required when the verifier needs no sandbox); maybe emit."""
    effects = Effects()
    if state is None:
        state = GroupState(group_id=traj.group_id, group_size=traj.group_size, first_seen=now)
    if state.emitted_at is not None:
        if traj.id not in state.emitted_ids:
            effects.ledger.append(_dropped(traj.id, traj.group_id, "late: its group was emitted"))
        return state, effects
    if traj.id in state.members:
        return state, effects  # redelivery
    member = Member(trajectory=raw, sent_at=now)
    state.members[traj.id] = member
    if traj.verifier.needs_sandbox:
        request = request_for(traj, 0, policy)
        member.request_id = request.request_id
        effects.requests.append(request)
    else:
        if inline is None:
            raise ValueError(f"{traj.verifier.name} needs no sandbox: pass its inline score")
        member.score = inline
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
    """A sandbox result arrived: record it (or retry a sandbox_error), maybe emit."""
    effects = Effects()
    if state is None or state.emitted_at is not None:
        return state, effects  # unknown or finished group: a late duplicate
    member = state.members.get(result.trajectory_id)
    if member is None or member.score is not None or result.attempt != member.attempt:
        return state, effects  # duplicate, stale attempt, or not ours
    if result.outcome == Outcome.SANDBOX_ERROR and member.attempt + 1 < policy.max_attempts:
        _retry(member, now, policy, effects)
    else:
        member.score = score_result(result)
    _maybe_emit(state, now, policy, effects, dispatcher_id)
    return state, effects


def on_tick(
    state: GroupState, now: float, policy: Policy, dispatcher_id: str = ""
) -> tuple[GroupState, Effects]:
    """Deadlines: retry or mask members whose result is overdue; emit a late group;
    expire an old tombstone."""
    effects = Effects()
    if state.emitted_at is not None:
        effects.delete = now - state.emitted_at > policy.tombstone_ttl_s
        return state, effects
    for member in state.members.values():
        if member.score is None and now - member.sent_at > policy.request_deadline_s:
            if member.attempt + 1 < policy.max_attempts:
                _retry(member, now, policy, effects)
            else:
                member.score = Score(
                    outcome=Outcome.SANDBOX_ERROR,
                    masked=True,
                    mask_reason=f"no sandbox result after {member.attempt + 1} attempts",
                )
    _maybe_emit(state, now, policy, effects, dispatcher_id)
    return state, effects


def is_due(state: GroupState, now: float, policy: Policy) -> bool:
    """Whether on_tick would change anything (the timer sends ticks only for these)."""
    if state.emitted_at is not None:
        return now - state.emitted_at > policy.tombstone_ttl_s
    if now - state.first_seen > policy.group_deadline_s:
        return True
    return any(
        m.score is None and now - m.sent_at > policy.request_deadline_s
        for m in state.members.values()
    )


def _retry(member: Member, now: float, policy: Policy, effects: Effects) -> None:
    traj = codec.decode(member.trajectory, Trajectory)
    member.attempt += 1
    member.sent_at = now
    effects.requests.append(request_for(traj, member.attempt, policy))


def _maybe_emit(
    state: GroupState, now: float, policy: Policy, effects: Effects, dispatcher_id: str
) -> None:
    scored = all(m.score is not None for m in state.members.values())
    complete = len(state.members) >= state.group_size
    late = now - state.first_seen > policy.group_deadline_s
    if not scored or not (complete or late):
        return
    members = sorted(state.members.items())
    live = [m.score.reward for _, m in members if m.score and not m.score.masked]
    advantages = iter(group_advantages(live))
    for _, member in members:
        score = member.score
        assert score is not None
        advantage = 0.0 if score.masked else next(advantages)
        traj = codec.decode(member.trajectory, Trajectory)
        # Masked samples travel to the learner too: it records them in the ledger, so every
        # trajectory that reaches `rewards` gets exactly one ledger entry, from the learner.
        effects.rewards.append(_scored(traj, score, advantage, len(live), dispatcher_id, now))
    state.emitted_at = now
    state.emitted_ids = [tid for tid, _ in members]
    state.members = {}


def _scored(
    traj: Trajectory, score: Score, advantage: float, n_live: int, dispatcher_id: str, now: float
) -> ScoredTrajectory:
    return ScoredTrajectory(
        id=scored_id(traj.id),
        trajectory=traj,
        reward=score.reward,
        advantage=advantage,
        outcome=score.outcome,
        passed=score.passed,
        total=score.total,
        components=score.components,
        group_size_scored=n_live,
        masked=score.masked,
        mask_reason=score.mask_reason,
        dispatcher_id=dispatcher_id,
        scored_at=now,
        verifier_name=score.verifier_name,
        verifier_version=score.verifier_version,
        image_digest=score.image_digest,
        origin=traj.origin,
        parent_id=traj.id,
    )


def scored_id(trajectory_id: str) -> str:
    """Deterministic id of a trajectory's reward, so a re-emission carries the same id."""
    return f"{trajectory_id}:scored"


def _dropped(trajectory_id: str, group_id: str, reason: str) -> LedgerEntry:
    return LedgerEntry(
        trajectory_id=trajectory_id,
        group_id=group_id,
        status=LedgerStatus.DROPPED,
        reason=reason,
        writer="dispatcher",
    )
