"""The pure part of replay: lineage, regrouping, verifier overrides, reward-map re-scoring,
throttling and instants. services/replay.py does the reading and publishing.

Lineage: a replayed trajectory is a new message (origin=replay) whose parent_id is the id
of the trajectory it copies; a replay of a replay points at its immediate parent, so the
chain can be followed back to the original.

Idempotency: the new id is derived from (source id, replay tag), the tag from what the
replay does (source, target, verifier override, reward map) unless given, so a rerun of
the same replay makes the same ids and groups, and services/replay.py skips the ones the
target already holds: an interrupted replay resumes; a finished one publishes nothing.

Groups: the dispatcher remembers emitted groups and drops late members (ledger: late),
so a replay must not reuse the original group ids. Each original group becomes a new
group `{group_id}~{tag}` (tag: one per replay run) made of the members the selection
holds, re-indexed 0..n-1 with group_size n, so a group cut by a time window is complete
and scored at once instead of waiting for its deadline.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, Final

import msgspec

from schemas.envelope import Origin, new_id, now
from schemas.rollout import ScoredTrajectory, Trajectory
from schemas.sandbox import VerifierSpec

if TYPE_CHECKING:
    from services.settings import RewardsSettings

MAX_GROUP_ID: Final = 256
_TAG_ROOM: Final = 24


def new_tag() -> str:
    """A short tag naming one replay run (the random tail of a UUIDv7)."""
    return new_id().replace("-", "")[-10:]


def replay_tag(*parts: object) -> str:
    """The tag of a replay doing `parts` (source, target, verifier override, reward map):
    the same replay gets the same tag, another one another tag."""
    blob = json.dumps(parts, sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:10]


def replayed_id(source_id: str, tag: str) -> str:
    """The replayed copy's id: a UUIDv8 (RFC 9562, custom) hashed from (source id, tag)."""
    digest = hashlib.sha256(f"{source_id}\x1f{tag}".encode()).digest()
    value = int.from_bytes(digest[:16], "big")
    value = value & ~(0xF << 76) | (0x8 << 76)  # version 8
    value = value & ~(0x3 << 62) | (0x2 << 62)  # RFC 4122 variant
    return str(uuid.UUID(int=value))


def replay_group_id(original: str, tag: str) -> str:
    """The replayed group's id: the original's, then `~tag` (within the 256-char key)."""
    return f"{original[: MAX_GROUP_ID - _TAG_ROOM]}~{tag}"


@dataclass
class GroupPlan:
    """What the selection holds, counted in a first pass: distinct trajectories per
    original group. The second pass asks `place` where each one goes."""

    tag: str = field(default_factory=new_tag)
    members: dict[str, list[str]] = field(default_factory=dict)
    """Original group id -> trajectory ids in the order first seen."""
    seen: set[str] = field(default_factory=set)
    duplicates: int = 0

    def add(self, traj: Trajectory) -> bool:
        """Count a trajectory; False for a repeat of one already counted (at-least-once
        delivery can write a record twice)."""
        if traj.id in self.seen:
            self.duplicates += 1
            return False
        self.seen.add(traj.id)
        self.members.setdefault(traj.group_id, []).append(traj.id)
        return True

    @property
    def trajectories(self) -> int:
        return len(self.seen)

    @property
    def groups(self) -> int:
        return len(self.members)

    def place(self, traj: Trajectory) -> tuple[str, int, int]:
        """(new group id, group size, index) of a counted trajectory."""
        ids = self.members.get(traj.group_id)
        if ids is None or traj.id not in self.seen:
            raise KeyError(f"trajectory {traj.id} was not in the first pass")
        return replay_group_id(traj.group_id, self.tag), len(ids), ids.index(traj.id)


def in_process() -> frozenset[str]:
    """Names of the verifiers the dispatcher runs itself (no sandbox)."""
    from sandbox_workers.verifiers import Exact, MathAnswer, Regex

    return frozenset({Exact.name, MathAnswer.name, Regex.name})


def override_verifier(spec: VerifierSpec, changes: dict[str, Any]) -> VerifierSpec:
    """`spec` with the fields of `changes` replaced, validated as a reader would. A change
    of `name` starts from a blank spec (another verifier's inputs mean nothing to it),
    routed in-process or to the sandbox by the new verifier's kind unless `changes` says."""
    unknown = sorted(set(changes) - set(VerifierSpec.__struct_fields__))
    if unknown:
        raise ValueError(f"unknown verifier field(s) {unknown}")
    base = msgspec.structs.asdict(spec)
    if "name" in changes and changes["name"] != spec.name:
        base = {"name": changes["name"], "needs_sandbox": changes["name"] not in in_process()}
    base.update(changes)
    try:
        return msgspec.convert(base, VerifierSpec)
    except msgspec.ValidationError as exc:
        raise ValueError(f"invalid verifier override: {exc}") from None


def derive(
    traj: Trajectory,
    plan: GroupPlan,
    verifier: dict[str, Any] | None = None,
    created_at: float | None = None,
) -> Trajectory:
    """The replayed copy of `traj`: id from (traj.id, plan.tag), origin=replay,
    parent_id=traj.id, regrouped, optionally with another verifier."""
    group_id, size, index = plan.place(traj)
    return msgspec.structs.replace(
        traj,
        id=replayed_id(traj.id, plan.tag),
        created_at=now() if created_at is None else created_at,
        origin=Origin.REPLAY,
        parent_id=traj.id,
        group_id=group_id,
        group_size=size,
        index=index,
        verifier=override_verifier(traj.verifier, verifier) if verifier else traj.verifier,
    )


def rescore_group(
    members: list[tuple[ScoredTrajectory, Trajectory]], cfg: RewardsSettings, writer: str
) -> list[ScoredTrajectory]:
    """Re-score one replayed group under another reward map, without running anything
    again: each original verdict (outcome, passed, total) gets the new map's reward, and
    the group its advantages anew. `members` pairs each original ScoredTrajectory with its
    replayed trajectory."""
    from sandbox_workers.rewards import reward
    from streams.groups import group_advantages, scored_id

    values = [reward(old.outcome, old.passed, old.total, cfg) for old, _ in members]
    live = [v for v in values if v is not None]
    advantages = iter(group_advantages(live))
    out = []
    for (old, traj), value in zip(members, values, strict=True):
        masked = value is None or old.masked
        out.append(
            msgspec.structs.replace(
                old,
                id=scored_id(traj.id),
                created_at=now(),
                origin=Origin.REPLAY,
                parent_id=traj.id,
                trajectory=traj,
                reward=0.0 if value is None else value,
                advantage=0.0 if value is None else next(advantages),
                group_size_scored=len(live),
                masked=masked,
                mask_reason=old.mask_reason or ("masked by the reward map" if masked else ""),
                dispatcher_id=writer,
                scored_at=now(),
            )
        )
    return out


class TokenBucket:
    """At most `rate` events per second on average, `burst` at once (rate 0: no limit).
    `wait(n)` says how long to sleep before n more events may go."""

    def __init__(
        self, rate: float, burst: int, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if rate < 0 or burst < 1:
            raise ValueError("rate must be >= 0 and burst >= 1")
        self.rate, self.burst, self.clock = rate, burst, clock
        self.tokens = float(burst)
        self.stamp = clock()

    def wait(self, n: int = 1) -> float:
        """Take n tokens; the seconds the caller must sleep first (0 when available)."""
        if self.rate == 0:
            return 0.0
        t = self.clock()
        self.tokens = min(float(self.burst), self.tokens + (t - self.stamp) * self.rate)
        self.stamp = t
        self.tokens -= n
        return 0.0 if self.tokens >= 0 else -self.tokens / self.rate


_RELATIVE: Final = re.compile(r"^-?(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)$")
_UNITS: Final = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_instant(text: str, now_s: float | None = None) -> int:
    """Unix milliseconds of an instant given as ISO 8601 (`2025-01-31T12:00:00Z`; no zone
    means UTC), Unix seconds (`1738324800`), or a time ago (`15m`, `-2h`, `90s`, `1d`)."""
    raw = text.strip()
    now_s = time.time() if now_s is None else now_s
    rel = _RELATIVE.match(raw)
    if rel:
        return round((now_s - float(rel[1]) * _UNITS[rel[2]]) * 1000)
    try:
        return round(float(raw) * 1000)
    except ValueError:
        pass
    try:
        stamp = datetime.fromisoformat(raw.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise ValueError(
            f"{text!r} is not a time: use ISO 8601 (2025-01-31T12:00:00Z), Unix seconds, "
            "or a time ago such as 15m, 2h, 1d"
        ) from None
    if stamp.tzinfo is None:
        from datetime import UTC

        stamp = stamp.replace(tzinfo=UTC)
    return round(stamp.timestamp() * 1000)
