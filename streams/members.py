"""Pure parts of the group state machine (streams/groups.py): a member's Score, the
dispatcher's Policy, the code a request runs,
group-relative advantages, and the messages built for one member (its sandbox request, its
reward, its dispatcher fate)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import msgspec

from schemas.learning import LedgerEntry, LedgerStatus
from schemas.rollout import ScoredTrajectory, Trajectory
from schemas.sandbox import Outcome, SandboxRequest

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


def scoring_request_id(trajectory_id: str) -> str:
    """The request id of a trajectory's scoring run (its own hidden tests, the reward).
    Stable across attempts; multi-turn feedback runs use other ids (`{tid}:turn{n}`), so
    they never become the score. A producer that ran the very scoring spec on the final
    code may publish its result under this id: the dispatcher then reuses it (and the
    sandbox workers' request_id + attempt dedup never runs it twice)."""
    return f"{trajectory_id}:req"


def request_for(traj: Trajectory, attempt: int, policy: Policy) -> SandboxRequest:
    return SandboxRequest(
        request_id=scoring_request_id(traj.id),
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


def scored_id(trajectory_id: str) -> str:
    """Deterministic id of a trajectory's reward, so a re-emission carries the same id."""
    return f"{trajectory_id}:scored"


def fate_id(trajectory_id: str) -> str:
    """Deterministic id of the dispatcher's ledger entry for a trajectory it drops: one
    fate per trajectory id, however often the trajectory is redelivered."""
    return f"{trajectory_id}:dispatcher-fate"


def scored(
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


def dropped(trajectory_id: str, group_id: str, reason: str) -> LedgerEntry:
    return LedgerEntry(
        id=fate_id(trajectory_id),
        trajectory_id=trajectory_id,
        group_id=group_id,
        status=LedgerStatus.DROPPED,
        reason=reason,
        writer="dispatcher",
    )
