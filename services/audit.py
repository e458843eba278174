"""`rollstream audit`: show, for a run, that every published trajectory was trained on
once or dropped with a recorded reason (DESIGN.md section 3).

Reads the run's `trajectories`, `rewards`, `ledger` and `dlq` topics and the learner's
committed offsets, then accounts (pure: `account`):

- published: distinct trajectory ids on `trajectories`, plus those that reached
  `rewards` directly (production traces judged by feedback in the ingest gateway, and
  reward-map replays, never pass `trajectories`).
- scored: distinct trajectory ids on `rewards` (masked ones counted apart).
- fates, from the ledger (entries deduplicated by message id, since a crashed writer
  re-sends them): trained, dropped by reason, masked by reason. A trajectory record on
  `trajectories` that the dispatcher dead-lettered (named by partition and offset in the
  DLQ) is accounted as dead-lettered.
- in flight: no fate yet, and still legitimately pending: a reward beyond the learner's
  committed offset (the learner commits only after its ledger entries are written), or
  a trajectory not yet scored and younger than the grace period (the dispatcher waits
  for group members and sandbox results up to its deadlines).
- unaccounted: no fate, and not in flight. Also a failure: conflicting fates (two
  distinct ledger entries for one trajectory). Either makes the audit exit 1.
- ledger_only: fates of ids never seen published (published before the topics' retention
  began, typically); reported, not a failure.

With `finished` (the run is over) nothing is in flight: every id without a fate is
unaccounted.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from schemas import codec, topics
from schemas.learning import LedgerEntry, LedgerStatus
from schemas.rollout import ScoredTrajectory, Trajectory
from schemas.transport import BlobRef, DeadLetter

if TYPE_CHECKING:
    from services.settings import Settings

MAX_IDS = 1000
"""Most unaccounted ids listed (the count is always exact)."""


@dataclass(frozen=True, slots=True)
class Seen:
    """Where and when a trajectory id was seen on a topic."""

    partition: int
    offset: int
    timestamp_ms: int
    origin: str = "live"
    masked: bool = False


@dataclass
class Observed:
    """What the topics hold, reduced to what accounting needs."""

    published: dict[str, Seen] = field(default_factory=dict)
    """Trajectory id -> its first record on `trajectories`."""
    scored: dict[str, Seen] = field(default_factory=dict)
    """Trajectory id -> its first record on `rewards`."""
    ledger: dict[str, LedgerEntry] = field(default_factory=dict)
    """Ledger entries by message id."""
    dead_positions: set[tuple[int, int]] = field(default_factory=set)
    """(partition, offset) of `trajectories` records the DLQ names."""
    dlq: int = 0
    undecodable: Counter[str] = field(default_factory=Counter)
    learner_committed: dict[int, int] | None = None
    """Per rewards partition, the learner group's committed offset; None: no learner
    group has committed yet."""


@dataclass
class AuditReport:
    prefix: str = ""
    finished: bool = False
    grace_s: float = 0.0
    published: int = 0
    published_by_origin: Counter[str] = field(default_factory=Counter)
    direct_to_rewards: int = 0
    scored: int = 0
    scored_masked: int = 0
    trained: int = 0
    dropped: Counter[str] = field(default_factory=Counter)
    masked: Counter[str] = field(default_factory=Counter)
    dead_lettered: int = 0
    in_flight: int = 0
    unaccounted_ids: list[str] = field(default_factory=list)
    unaccounted: int = 0
    conflicts: dict[str, list[str]] = field(default_factory=dict)
    ledger_only: int = 0
    dlq: int = 0
    undecodable: Counter[str] = field(default_factory=Counter)

    @property
    def ok(self) -> bool:
        return not self.unaccounted and not self.conflicts

    def to_json(self) -> dict[str, Any]:
        return {
            "prefix": self.prefix,
            "ok": self.ok,
            "finished": self.finished,
            "grace_s": self.grace_s,
            "published": self.published,
            "published_by_origin": dict(self.published_by_origin),
            "direct_to_rewards": self.direct_to_rewards,
            "scored": self.scored,
            "scored_masked": self.scored_masked,
            "trained": self.trained,
            "dropped": dict(self.dropped),
            "masked": dict(self.masked),
            "dead_lettered": self.dead_lettered,
            "in_flight": self.in_flight,
            "unaccounted": self.unaccounted,
            "unaccounted_ids": self.unaccounted_ids,
            "conflicts": self.conflicts,
            "ledger_only": self.ledger_only,
            "dlq": self.dlq,
            "undecodable": dict(self.undecodable),
        }


def reason_class(reason: str) -> str:
    """The kind of a ledger reason: the text before its first colon (`stale: lag 5 >
    max_lag 4` -> `stale`)."""
    head = reason.split(":", 1)[0].strip()
    return head[:60] or "unspecified"


def _fates(ledger: dict[str, LedgerEntry]) -> dict[str, list[LedgerEntry]]:
    out: dict[str, list[LedgerEntry]] = {}
    for entry in ledger.values():
        out.setdefault(entry.trajectory_id, []).append(entry)
    return out


def _in_flight(tid: str, obs: Observed, now_ms: int, grace_ms: int, finished: bool) -> bool:
    if finished:
        return False
    reward = obs.scored.get(tid)
    if reward is not None:
        committed = (obs.learner_committed or {}).get(reward.partition, 0)
        return reward.offset >= committed
    pub = obs.published[tid]
    return now_ms - pub.timestamp_ms <= grace_ms


def account(
    obs: Observed, now_ms: int, grace_s: float, finished: bool = False, prefix: str = ""
) -> AuditReport:
    """The audit of what the topics hold (pure; see the module docstring)."""
    rep = AuditReport(prefix=prefix, finished=finished, grace_s=grace_s, dlq=obs.dlq)
    rep.undecodable = Counter(obs.undecodable)
    universe = dict(obs.published)
    for tid, seen in obs.scored.items():
        if tid not in universe:
            universe[tid] = seen
            rep.direct_to_rewards += 1
    rep.published = len(universe)
    rep.published_by_origin = Counter(s.origin for s in universe.values())
    rep.scored = len(obs.scored)
    rep.scored_masked = sum(s.masked for s in obs.scored.values())
    fates = _fates(obs.ledger)
    rep.ledger_only = sum(1 for tid in fates if tid not in universe)
    unaccounted: list[str] = []
    for tid in sorted(universe):
        entries = fates.get(tid, [])
        if len(entries) > 1:
            rep.conflicts[tid] = sorted(f"{e.status.value}: {e.reason}" for e in entries)
        if entries:
            _count_fate(rep, entries[0])
            continue
        record = obs.published.get(tid)
        if record is not None and (record.partition, record.offset) in obs.dead_positions:
            rep.dead_lettered += 1
        elif _in_flight(tid, obs, now_ms, round(grace_s * 1000), finished):
            rep.in_flight += 1
        else:
            unaccounted.append(tid)
    rep.unaccounted = len(unaccounted)
    rep.unaccounted_ids = unaccounted[:MAX_IDS]
    return rep


def _count_fate(rep: AuditReport, entry: LedgerEntry) -> None:
    if entry.status is LedgerStatus.TRAINED:
        rep.trained += 1
    elif entry.status is LedgerStatus.DROPPED:
        rep.dropped[reason_class(entry.reason)] += 1
    else:
        rep.masked[reason_class(entry.reason)] += 1


# -- reading the topics -----------------------------------------------------------------


def default_grace_s(settings: Settings) -> float:
    """How long the dispatcher may legitimately hold a trajectory before its reward (its
    group deadline, plus every sandbox attempt's deadline), plus a minute."""
    d = settings.dispatcher
    return d.group_deadline_s + d.request_deadline_s * d.max_attempts + 60.0


async def observe(settings: Settings) -> Observed:
    """Read the run's topics and the learner's committed offsets."""
    from services import blobs, kafka_read

    prefix = settings.topics.prefix
    obs = Observed()
    claim = blobs.from_settings(settings)
    try:
        traj_topic = topics.TRAJECTORIES.full_name(prefix)
        for rec in await kafka_read.read_topic(settings, traj_topic):
            _see_trajectory(obs, rec)
        for rec in await kafka_read.read_topic(settings, topics.REWARDS.full_name(prefix)):
            await _see_reward(obs, rec, claim)
        for rec in await kafka_read.read_topic(settings, topics.LEDGER.full_name(prefix)):
            _see_ledger(obs, rec)
        for rec in await kafka_read.read_topic(settings, topics.DLQ.full_name(prefix)):
            _see_dead(obs, rec, traj_topic)
    finally:
        await claim.aclose()
    obs.learner_committed = await learner_committed(settings)
    return obs


def _see_trajectory(obs: Observed, rec: Any) -> None:
    try:
        msg = codec.decode(rec.value or b"")
    except codec.SchemaError:
        obs.undecodable["trajectories"] += 1
        return
    if isinstance(msg, Trajectory | BlobRef) and msg.id not in obs.published:
        obs.published[msg.id] = Seen(rec.partition, rec.offset, rec.timestamp_ms, str(msg.origin))


async def _see_reward(obs: Observed, rec: Any, claim: Any) -> None:
    try:
        msg = await claim.unpack(rec.value or b"", ScoredTrajectory)
    except codec.SchemaError:
        obs.undecodable["rewards"] += 1
        return
    tid = msg.trajectory.id
    if tid not in obs.scored:
        origin = str(msg.trajectory.origin)
        obs.scored[tid] = Seen(rec.partition, rec.offset, rec.timestamp_ms, origin, msg.masked)


def _see_ledger(obs: Observed, rec: Any) -> None:
    try:
        entry = codec.decode(rec.value or b"", LedgerEntry)
    except codec.SchemaError:
        obs.undecodable["ledger"] += 1
        return
    obs.ledger.setdefault(entry.id, entry)


def _see_dead(obs: Observed, rec: Any, traj_topic: str) -> None:
    obs.dlq += 1
    try:
        letter = codec.decode(rec.value or b"", DeadLetter)
    except codec.SchemaError:
        obs.undecodable["dlq"] += 1
        return
    if letter.source_topic == traj_topic:
        obs.dead_positions.add((letter.source_partition, letter.source_offset))


async def learner_committed(settings: Settings) -> dict[int, int] | None:
    """Per rewards partition, the highest offset any learner group of the run committed."""
    from services import status

    rewards = topics.REWARDS.full_name(settings.topics.prefix)
    prefix = settings.topics.prefix
    groups = await status.group_offsets(settings, lambda g: topics.LEARNER.matches(prefix, g))
    found: dict[int, int] = {}
    for offsets in groups.values():
        for (topic, partition), offset in offsets.items():
            if topic == rewards:
                found[partition] = max(found.get(partition, 0), offset)
    return found or None


async def audit(settings: Settings, *, grace_s: float | None = None, finished: bool = False):  # type: ignore[no-untyped-def]
    """The audit of the settings' run (prefix)."""
    import time

    obs = await observe(settings)
    grace = default_grace_s(settings) if grace_s is None else grace_s
    now_ms = round(time.time() * 1000)
    return account(obs, now_ms, grace, finished, settings.topics.prefix)
