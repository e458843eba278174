"""`rollstream status`: the operator's view of a run (DESIGN.md section 8).

A snapshot holds: consumer lag per group of the run (groups named `{prefix}.*`: the
dispatcher, the learner, the sandbox workers ...), throughput per topic over the last
window, the learner's published version, step and samples consumed, the staleness of
recent rewards, the reward trend, sandbox pool health (the worker group and the labelled
containers), traces awaiting feedback at the ingest gateway, and the DLQ count. The pure
parts (`lag`, `trend`, `staleness`) are unit-tested; services/status_view.py renders.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from schemas import codec, topics
from schemas.learning import WeightUpdate
from schemas.rollout import ScoredTrajectory
from services import kafka

if TYPE_CHECKING:
    from aiokafka import AIOKafkaConsumer

    from services.settings import Settings

TopicPart = tuple[str, int]
DLQ_READ_LIMIT = 50_000
"""Up to this many, dead letters are counted one by one (exact), else by offsets."""


@dataclass
class GroupStatus:
    group: str
    members: int | None
    state: str
    lag: dict[str, int]
    """Topic -> records behind the end (sum over partitions)."""


@dataclass
class Snapshot:
    prefix: str
    taken_at: float
    groups: list[GroupStatus] = field(default_factory=list)
    topic_records: dict[str, int] = field(default_factory=dict)
    """Topic name (without prefix) -> offsets held (end - first offset; on topics written
    in transactions this includes the commit markers, so it is an upper bound)."""
    throughput: dict[str, float] = field(default_factory=dict)
    """Topic name -> records per second over the window."""
    window_s: float = 60.0
    learner: dict[str, Any] = field(default_factory=dict)
    staleness: dict[str, float] = field(default_factory=dict)
    reward_trend: list[float] = field(default_factory=list)
    """Mean reward of consecutive slices of the recent rewards, oldest first."""
    outcomes: dict[str, int] = field(default_factory=dict)
    sandbox: dict[str, Any] = field(default_factory=dict)
    ingest: dict[str, int] = field(default_factory=dict)
    dlq: int = 0
    problems: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


# -- pure -------------------------------------------------------------------------------


def lag(committed: dict[TopicPart, int], ends: dict[TopicPart, int]) -> dict[str, int]:
    """Records behind per topic: end - committed over the partitions the group committed
    (a partition it never committed counts from 0)."""
    out: dict[str, int] = {}
    for (topic, part), end in ends.items():
        if not any(t == topic for t, _ in committed):
            continue
        out[topic] = out.get(topic, 0) + max(0, end - committed.get((topic, part), 0))
    return out


def trend(rewards: Sequence[tuple[int, float]], buckets: int = 5) -> list[float]:
    """Mean reward of `buckets` equal slices of (timestamp_ms, reward) pairs, oldest
    first (fewer when there are fewer rewards)."""
    ordered = [r for _, r in sorted(rewards, key=lambda x: x[0])]
    if not ordered:
        return []
    n = min(buckets, len(ordered))
    size = len(ordered) / n
    out = []
    for i in range(n):
        part = ordered[round(i * size) : round((i + 1) * size)]
        out.append(round(statistics.fmean(part), 4))
    return out


def staleness(current_version: int, sample_versions: Sequence[int]) -> dict[str, float]:
    """Lag in policy versions of recent samples (known versions only)."""
    lags = [max(0, current_version - v) for v in sample_versions if v >= 0]
    if current_version < 0 or not lags:
        return {}
    return {"mean": round(statistics.fmean(lags), 3), "max": float(max(lags)), "n": len(lags)}


# -- Kafka ------------------------------------------------------------------------------


async def group_offsets(
    settings: Settings, want: Callable[[str], bool], problems: list[str] | None = None
) -> dict[str, dict[TopicPart, int]]:
    """Committed offsets of the consumer groups whose id `want` accepts, each plus the
    records past it the commit marks answered (`kafka.taken`). A group whose offsets cannot
    be read has none here (and a line in `problems` when given)."""
    admin = kafka.admin(settings)
    await admin.start()
    try:
        ids = [g[0] for g in await admin.list_consumer_groups() if want(str(g[0]))]
        out: dict[str, dict[TopicPart, int]] = {}
        for gid in sorted(ids):
            try:
                offsets = await admin.list_consumer_group_offsets(gid)
            except Exception as exc:
                out[gid] = {}
                if problems is not None:
                    problems.append(f"group {gid}: offsets unknown ({_reason(exc)})")
                continue
            out[gid] = {
                (t.topic, t.partition): kafka.taken(m.offset, m.metadata)
                for t, m in offsets.items()
            }
        return out
    finally:
        await admin.close()


def _reason(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


async def _members(settings: Settings, ids: list[str]) -> dict[str, tuple[int | None, str]]:
    """Members and state per group, described one group per request: aiokafka 0.14 decodes
    a DescribeGroups v3 answer with the v2 schema, which misreads every group after the
    first ("Buffer underrun decoding string" against Kafka 4.x). Member metadata and
    assignments (faust's own protocol among them) are never decoded. A group that cannot
    be described is `(None, "unknown (reason)")`."""
    out: dict[str, tuple[int | None, str]] = {}
    if not ids:
        return out
    admin = kafka.admin(settings)
    await admin.start()
    try:
        for gid in ids:
            out[gid] = await _describe_one(admin, gid)
    finally:
        await admin.close()
    return out


async def _describe_one(admin: Any, gid: str) -> tuple[int | None, str]:
    try:
        responses = await asyncio.wait_for(admin.describe_consumer_groups([gid]), 15.0)
        for response in responses:
            for g in response.groups:
                if str(g[1]) == gid:
                    return len(g[5]), str(g[2]) or "unknown"
        return None, "unknown (not described by its coordinator)"
    except Exception as exc:
        return None, f"unknown ({_reason(exc)})"


async def _offsets(
    settings: Settings, c: AIOKafkaConsumer, names: list[str], since_ms: int
) -> dict[str, Any]:
    existing = await c.topics()
    tps = await kafka.topic_partitions(settings, [n for n in names if n in existing])
    if not tps:
        return {"low": {}, "high": {}, "since": {}}
    since = await c.offsets_for_times({tp: since_ms for tp in tps})
    return {
        "low": await c.beginning_offsets(tps),
        "high": await c.end_offsets(tps),
        "since": {tp: (hit.offset if hit else None) for tp, hit in since.items()},
    }


async def snapshot(settings: Settings, window_s: float = 60.0, recent: int = 200) -> Snapshot:
    """Everything `rollstream status` shows, read once."""
    from services import kafka_read

    prefix = settings.topics.prefix
    snap = Snapshot(prefix=prefix, taken_at=time.time(), window_s=window_s)
    names = {spec.name: spec.full_name(prefix) for spec in topics.ALL}
    c = kafka_read.consumer(settings)
    await c.start()
    try:
        off = await _offsets(
            settings, c, list(names.values()), round((time.time() - window_s) * 1000)
        )
        _fill_topics(snap, names, off)
        await _fill_groups(snap, settings, off["high"])
        await _fill_learner(snap, settings, c, names)
        await _fill_rewards(snap, c, names["rewards"], off, recent)
        snap.dlq = await _count(c, names["dlq"], off, snap.dlq)
    finally:
        await c.stop()
    await _fill_extras(snap, settings)
    return snap


def _fill_topics(snap: Snapshot, names: dict[str, str], off: dict[str, Any]) -> None:
    short = {full: name for name, full in names.items()}
    for tp, high in off["high"].items():
        name = short[tp.topic]
        snap.topic_records[name] = snap.topic_records.get(name, 0) + high - off["low"][tp]
        since = off["since"].get(tp)
        recent = 0 if since is None else high - since
        snap.throughput[name] = snap.throughput.get(name, 0.0) + recent / snap.window_s
    snap.throughput = {k: round(v, 3) for k, v in snap.throughput.items()}
    snap.dlq = snap.topic_records.get("dlq", 0)


async def _fill_groups(snap: Snapshot, settings: Settings, high: dict[Any, int]) -> None:
    ends = {(tp.topic, tp.partition): v for tp, v in high.items()}
    groups = await group_offsets(settings, lambda g: g.startswith(f"{snap.prefix}."), snap.problems)
    members = await _members(settings, list(groups))
    for gid, committed in groups.items():
        n, state = members.get(gid, (None, "unknown"))
        snap.groups.append(GroupStatus(gid, n, state, lag(committed, ends)))


async def _fill_learner(snap: Snapshot, settings: Settings, c: Any, names: dict[str, str]) -> None:
    from services import kafka_read

    policy = settings.learner.policy
    if names["weights"] not in await c.topics():
        return
    spans = await kafka_read.spans(settings, c, names["weights"], kafka_read.Selection())
    latest: WeightUpdate | None = None
    async for rec in kafka_read.read(c, names["weights"], spans, 30.0):
        if rec.key == policy.encode() and rec.value:
            try:
                latest = codec.decode(rec.value, WeightUpdate)
            except codec.SchemaError:
                snap.problems.append(f"undecodable weights record at offset {rec.offset}")
    if latest is not None:
        snap.learner = {
            "policy": policy,
            "version": latest.version,
            "step": latest.step,
            "samples_consumed": latest.samples_consumed,
            "published_s_ago": round(time.time() - latest.created_at, 1),
        }


async def _fill_rewards(
    snap: Snapshot, c: Any, topic: str, off: dict[str, Any], recent: int
) -> None:
    from services import kafka_read

    spans = [
        kafka_read.Span(tp.partition, max(off["low"][tp], high - recent), high)
        for tp, high in off["high"].items()
        if tp.topic == topic
    ]
    pairs: list[tuple[int, float]] = []
    versions: list[int] = []
    outcomes: dict[str, int] = {}
    async for rec in kafka_read.read(c, topic, spans, 30.0):
        try:
            msg = codec.decode(rec.value or b"", ScoredTrajectory)
        except codec.SchemaError:
            continue  # a claim-checked or bad record: the trend does without it
        outcomes[msg.outcome.value] = outcomes.get(msg.outcome.value, 0) + 1
        if not msg.masked:
            pairs.append((rec.timestamp_ms, msg.reward))
        versions.append(msg.trajectory.policy_version)
    snap.reward_trend = trend(pairs)
    snap.outcomes = outcomes
    snap.staleness = staleness(int(snap.learner.get("version", -1)), versions)


async def _count(c: Any, topic: str, off: dict[str, Any], estimate: int) -> int:
    """Records of a small topic, counted by reading it: offset spans also count the
    commit markers of transactional producers (the dispatcher writes the DLQ in
    transactions). Above DLQ_READ_LIMIT the estimate stands."""
    from services import kafka_read

    if estimate > DLQ_READ_LIMIT:
        return estimate
    spans = [
        kafka_read.Span(tp.partition, off["low"][tp], high)
        for tp, high in off["high"].items()
        if tp.topic == topic
    ]
    return sum([1 async for _ in kafka_read.read(c, topic, spans, 30.0)])


async def _fill_extras(snap: Snapshot, settings: Settings) -> None:
    workers = topics.SANDBOX_WORKERS
    worker_group = next((g for g in snap.groups if workers.matches(snap.prefix, g.group)), None)
    snap.sandbox = {
        "workers": worker_group.members if worker_group else 0,
        "backlog": sum(worker_group.lag.values()) if worker_group else 0,
        "containers": await asyncio.to_thread(_containers, settings),
    }
    try:
        from redis.asyncio import Redis

        from services.ingest.state import pending_counts

        redis = Redis.from_url(settings.redis.endpoint, socket_timeout=5)
        try:
            snap.ingest = await pending_counts(redis, snap.prefix)
        finally:
            await redis.aclose()
    except Exception as exc:
        snap.problems.append(f"redis: {type(exc).__name__}: {exc}")


def _containers(settings: Settings) -> dict[str, int] | str:
    """Sandbox containers by state (all runs share the label), or why unknown."""
    try:
        from services.infra import docker_engine

        client = docker_engine.client(settings, 5.0)
        try:
            found = client.containers.list(all=True, filters={"label": "rollstream.sandbox"})
            states: dict[str, int] = {}
            for ctr in found:
                states[ctr.status] = states.get(ctr.status, 0) + 1
            return states
        finally:
            client.close()
    except Exception as exc:
        return f"unknown ({type(exc).__name__})"
