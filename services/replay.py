"""`rollstream replay`: publish a run's trajectories again (DESIGN.md section 8).

Sources: a topic of a run (`trajectories`, or `rewards` whose records embed their
trajectory) by offset range and/or time window, or JSONL / MessagePack log files
(`rollstream export` writes them). Every replayed trajectory is a new message with
origin=replay and parent_id = the original's id, regrouped (services/replay_plan.py).

Modes:
- default: publish to `{to_prefix}.trajectories`; the reward dispatcher scores them
  again, with the original verifier or the override given (`verifier`), for instance a
  stricter verifier or another version of it.
- `reward_map`: only from a source holding rewards. Each original verdict gets the given
  reward map's reward and the group new advantages; the ScoredTrajectory goes straight
  to `{to_prefix}.rewards` (nothing runs again). The learner records each in the ledger.

Two passes over the same records: the first counts (groups, duplicates, what is skipped
and why; a dry run stops there), the second publishes, throttled by a token bucket.
Resumable and idempotent: ids and groups come from (source id, replay tag) (see
services/replay_plan.py); before publishing, the target topic is scanned for the tag's
groups (by record key, `{group}~{tag}`) and what it already holds is skipped
(`already_published`), so a rerun publishes nothing new.
Records that cannot be used are skipped and counted with their reason, never published.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from schemas import codec, topics
from schemas.envelope import Message
from schemas.rollout import ScoredTrajectory, Trajectory
from services import kafka_read, logfiles
from services.replay_plan import GroupPlan, TokenBucket, derive, replay_tag, rescore_group

if TYPE_CHECKING:
    from schemas.claimcheck import ClaimCheck
    from services.settings import RewardsSettings, Settings

log = logging.getLogger("rollstream.replay")


@dataclass(frozen=True)
class TopicSource:
    """Records of `{prefix}.{topic}` within `selection`."""

    prefix: str
    topic: str = "trajectories"
    selection: kafka_read.Selection = field(default_factory=kafka_read.Selection)

    @property
    def name(self) -> str:
        return topics.BY_NAME[self.topic].full_name(self.prefix)


@dataclass(frozen=True)
class FileSource:
    paths: tuple[Path, ...]


Source = TopicSource | FileSource


@dataclass
class ReplayReport:
    """What a replay read, skipped and published."""

    source: str
    target: str
    tag: str
    dry_run: bool
    read: int = 0
    trajectories: int = 0
    groups: int = 0
    duplicates: int = 0
    skipped: Counter[str] = field(default_factory=Counter)
    published: int = 0
    already_published: int = 0
    """Replayed copies the target held before this run (an earlier run of the same tag)."""
    parents: dict[str, str] = field(default_factory=dict)
    """New trajectory id -> original id (lineage), for the published ones."""

    def to_json(self, with_ids: bool = False) -> dict[str, Any]:
        out: dict[str, Any] = {
            "source": self.source,
            "target": self.target,
            "tag": self.tag,
            "dry_run": self.dry_run,
            "records_read": self.read,
            "trajectories": self.trajectories,
            "groups": self.groups,
            "duplicates": self.duplicates,
            "skipped": dict(self.skipped),
            "published": self.published,
            "already_published": self.already_published,
        }
        if with_ids:
            out["lineage"] = self.parents
        return out


class _Reader:
    """Yields (message, where) from a source, resolving claim checks; skipped records are
    counted in `skipped` with their reason. Topic spans are fixed on first use so both
    passes read the same records."""

    def __init__(self, settings: Settings, source: Source, claim: ClaimCheck) -> None:
        self.settings, self.source, self.claim = settings, source, claim
        self.spans: list[kafka_read.Span] | None = None

    async def messages(self, skipped: Counter[str]) -> AsyncIterator[Message]:
        if isinstance(self.source, FileSource):
            for path in self.source.paths:
                for entry in logfiles.read_file(path):
                    yield entry.message
            return
        name, timeout = self.source.name, self.settings.replay.read_timeout_s
        sel = self.spans if self.spans is not None else self.source.selection
        async for rec in kafka_read.records(
            self.settings, name, sel, timeout, planned=self._planned
        ):
            try:
                yield await self.claim.unpack(rec.value or b"")
            except codec.SchemaError as exc:
                skipped[f"undecodable: {exc.where}: {exc.why}"[:160]] += 1

    def _planned(self, spans: list[kafka_read.Span]) -> None:
        self.spans = spans


def _trajectory(msg: Message, skipped: Counter[str], need_scored: bool) -> Trajectory | None:
    if isinstance(msg, ScoredTrajectory):
        return msg.trajectory
    if isinstance(msg, Trajectory) and not need_scored:
        return msg
    what = type(msg).__name__
    if isinstance(msg, Trajectory):
        reason = "a Trajectory has no verdict to re-score (replay rewards or their export)"
    else:
        reason = f"not a trajectory: {what}"
    skipped[reason] += 1
    return None


async def replay(
    settings: Settings,
    source: Source,
    *,
    to_prefix: str | None = None,
    verifier: dict[str, Any] | None = None,
    reward_map: RewardsSettings | None = None,
    dry_run: bool = False,
    tag: str | None = None,
) -> ReplayReport:
    """Replay `source` into `to_prefix` (default: the settings' prefix); see the module.
    `tag`: names this replay (default: derived from what it does, so a rerun resumes)."""
    from services import blobs

    if verifier and reward_map is not None:
        raise ValueError("choose a verifier override or a reward map, not both")
    to_prefix = to_prefix or settings.topics.prefix
    out_topic = topics.REWARDS if reward_map is not None else topics.TRAJECTORIES
    target = out_topic.full_name(to_prefix)
    rmap = None if reward_map is None else reward_map.model_dump()
    plan = GroupPlan(tag=tag or replay_tag(_describe(source), target, verifier or {}, rmap))
    report = ReplayReport(_describe(source), target, plan.tag, dry_run)
    claim = blobs.from_settings(settings)
    try:
        reader = _Reader(settings, source, claim)
        await _count(reader, plan, report, reward_map is not None)
        cap = settings.replay.max_records
        if report.trajectories > cap:
            raise ValueError(
                f"the selection holds {report.trajectories} trajectories, over replay."
                f"max_records={cap}: narrow it, or raise the limit on purpose"
            )
        if not dry_run and report.trajectories:
            await _ensure_topics(settings, to_prefix)
            held = await _already(settings, target, plan.tag, claim)
            await _publish(settings, reader, plan, report, claim, verifier, reward_map, held)
    finally:
        await claim.aclose()
    return report


async def _ensure_topics(settings: Settings, prefix: str) -> None:
    from services import topics as topic_admin

    target = settings.model_copy(
        update={"topics": settings.topics.model_copy(update={"prefix": prefix})}
    )
    await topic_admin.ensure(target)


def _describe(source: Source) -> str:
    if isinstance(source, FileSource):
        return ", ".join(str(p) for p in source.paths)
    return source.name


async def _count(reader: _Reader, plan: GroupPlan, report: ReplayReport, need_scored: bool) -> None:
    async for msg in reader.messages(report.skipped):
        report.read += 1
        traj = _trajectory(msg, report.skipped, need_scored)
        if traj is not None and traj.group_id.endswith(f"~{plan.tag}"):
            report.skipped["this replay's own output (an earlier run of its tag)"] += 1
        elif traj is not None:
            plan.add(traj)
    report.trajectories, report.groups = plan.trajectories, plan.groups
    report.duplicates = plan.duplicates


async def _publish(
    settings: Settings,
    reader: _Reader,
    plan: GroupPlan,
    report: ReplayReport,
    claim: ClaimCheck,
    verifier: dict[str, Any] | None,
    reward_map: RewardsSettings | None,
    held: set[str],
) -> None:
    sink = _Sink(settings, report, claim, held)
    await sink.start()
    try:
        done: set[str] = set()
        pending: dict[str, list[tuple[ScoredTrajectory, Trajectory]]] = {}
        writer = f"replay@{socket.gethostname()}"
        async for msg in reader.messages(Counter()):  # pass 1 counted the skips
            traj = _trajectory(msg, Counter(), reward_map is not None)
            if traj is None or traj.id in done or traj.id not in plan.seen:
                continue
            done.add(traj.id)
            new = derive(traj, plan, verifier)
            report.parents[new.id] = traj.id
            if reward_map is None:
                await sink.send(new.group_id, new)
                continue
            assert isinstance(msg, ScoredTrajectory)
            group = pending.setdefault(new.group_id, [])
            group.append((msg, new))
            if len(group) == new.group_size:
                for scored in rescore_group(pending.pop(new.group_id), reward_map, writer):
                    await sink.send(scored.group_id, scored)
        for group_id, members in pending.items():  # a record unreadable on the 2nd pass
            missing = members[0][1].group_size - len(members)
            log.warning("group %s: %d member(s) unreadable on the second pass", group_id, missing)
            for scored in rescore_group(members, reward_map or settings.rewards, writer):
                await sink.send(scored.group_id, scored)
        await sink.flush()
    finally:
        await sink.stop()


def _trajectory_id(msg: Message) -> str:
    return msg.trajectory.id if isinstance(msg, ScoredTrajectory) else msg.id


async def _already(settings: Settings, target: str, tag: str, claim: ClaimCheck) -> set[str]:
    """Ids of the trajectories of replay `tag` that `target` already holds (their records
    are keyed by the replayed group id, which ends with `~{tag}`)."""
    suffix, timeout = f"~{tag}".encode(), settings.replay.read_timeout_s
    held: set[str] = set()
    async for rec in kafka_read.records(settings, target, None, timeout, missing_ok=True):
        if rec.key is None or not rec.key.endswith(suffix):
            continue
        try:
            held.add(_trajectory_id(await claim.unpack(rec.value or b"")))
        except codec.SchemaError:
            continue  # unreadable: not counted as held, so it is published again
    return held


class _Sink:
    """Idempotent producer with claim check, batching and the token bucket."""

    def __init__(
        self, settings: Settings, report: ReplayReport, claim: ClaimCheck, held: set[str]
    ) -> None:
        self.settings, self.report, self.claim, self.held = settings, report, claim, held
        cfg = settings.replay
        self.bucket = TokenBucket(cfg.rate, cfg.burst)
        self.batch_size = cfg.batch
        self.futures: list[asyncio.Future[Any]] = []
        self.producer: Any = None

    async def start(self) -> None:
        from services import kafka

        self.producer = kafka.producer(self.settings, "rollstream-replay")
        await self.producer.start()

    async def send(self, key: str, msg: Message) -> None:
        if _trajectory_id(msg) in self.held:
            self.report.already_published += 1
            return
        delay = self.bucket.wait(1)
        if delay > 0:
            await asyncio.sleep(delay)
        value = await self.claim.pack(msg)
        fut = await self.producer.send(self.report.target, value=value, key=key.encode())
        self.futures.append(fut)
        if len(self.futures) >= self.batch_size:
            await self.flush()

    async def flush(self) -> None:
        futures, self.futures = self.futures, []
        if futures:
            await asyncio.gather(*futures)
            self.report.published += len(futures)

    async def stop(self) -> None:
        if self.producer is not None:
            await self.producer.stop()
