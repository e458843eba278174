"""Create and inspect the run's topics from the registry in schemas/topics.py."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field

from schemas import topics as registry
from services import kafka
from services.infra.common import Check
from services.settings import Settings


@dataclass
class TopicState:
    name: str
    spec: registry.TopicSpec
    want_partitions: int
    partitions: int | None = None
    """None when the topic does not exist."""
    configs: dict[str, str] = field(default_factory=dict)
    want_replication: int = 1
    """Replication the live cluster calls for (see `replication`)."""
    replication: int | None = None
    """Replicas of partition 0 (None when the topic does not exist)."""

    @property
    def exists(self) -> bool:
        return self.partitions is not None

    def problems(self) -> list[str]:
        if not self.exists:
            return [f"{self.name}: missing"]
        out = []
        if self.partitions != self.want_partitions:
            out.append(
                f"{self.name}: {self.partitions} partitions, declared {self.want_partitions}"
            )
        if self.replication is not None and self.replication < self.want_replication:
            out.append(
                f"{self.name}: replication {self.replication}, the cluster calls for "
                f"{self.want_replication}"
            )
        for key, value in topic_configs(self.spec, self.want_replication).items():
            if key in self.configs and self.configs[key] != value:
                out.append(f"{self.name}: {key}={self.configs[key]}, declared {value}")
        return out


REPLICATED_MIN_BROKERS = 3
"""From this many brokers on, topics get replication 3 and min.insync.replicas 2: with
acks=all a write survives one broker down, and is refused rather than lost with two."""


def replication(brokers: int) -> int:
    """Replication factor of the run's topics on a cluster of `brokers` brokers."""
    return 3 if brokers >= REPLICATED_MIN_BROKERS else 1


def topic_configs(spec: registry.TopicSpec, rf: int) -> dict[str, str]:
    """The declared topic configs, plus min.insync.replicas on a replicated cluster."""
    configs = spec.configs()
    if rf >= 3:
        configs["min.insync.replicas"] = "2"
    return configs


async def cluster_replication(settings: Settings) -> int:
    """Replication the live cluster calls for (describe_cluster's broker count)."""
    admin = kafka.admin(settings)
    await admin.start()
    try:
        cluster = await admin.describe_cluster()
    finally:
        await admin.close()
    return replication(len(cluster.get("brokers") or []))


async def describe(settings: Settings, prefix: str | None = None) -> list[TopicState]:
    from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

    prefix = prefix or settings.topics.prefix
    states = [
        TopicState(s.full_name(prefix), s, s.partition_count(settings.topics.partitions))
        for s in registry.ALL
    ]
    admin = kafka.admin(settings)
    await admin.start()
    try:
        cluster = await admin.describe_cluster()
        rf = replication(len(cluster.get("brokers") or []))
        for s in states:
            s.want_replication = rf
        existing = set(await admin.list_topics())
        present = [s for s in states if s.name in existing]
        if present:
            meta = await admin.describe_topics([s.name for s in present])
            counts = {m["topic"]: len(m["partitions"]) for m in meta}
            replicas = {
                m["topic"]: len(p[0]["replicas"])
                for m in meta
                if (p := sorted(m["partitions"], key=lambda x: x["partition"]))
            }
            resources = [ConfigResource(ConfigResourceType.TOPIC, s.name) for s in present]
            by_name = {s.name: s for s in present}
            for response in await admin.describe_configs(resources):
                for _err, _msg, _type, name, entries in response.resources:
                    values = {e[0]: str(e[1]) for e in entries}
                    by_name[name].configs = {
                        k: values[k]
                        for k in ("cleanup.policy", "retention.ms", "min.insync.replicas")
                        if k in values
                    }
            for s in present:
                s.partitions = counts.get(s.name)
                s.replication = replicas.get(s.name)
    finally:
        await admin.close()
    return states


async def ensure(settings: Settings, prefix: str | None = None) -> list[TopicState]:
    """Create the missing topics of the run (idempotent); return their state afterwards.
    Replication follows the live cluster (describe_cluster): 3 with min.insync.replicas 2
    on 3 or more brokers, else 1."""
    from aiokafka.admin import NewTopic
    from aiokafka.errors import TopicAlreadyExistsError

    states = await describe(settings, prefix)
    missing = [s for s in states if not s.exists]
    if missing:
        admin = kafka.admin(settings)
        await admin.start()
        try:
            for s in missing:
                topic = NewTopic(
                    s.name,
                    s.want_partitions,
                    s.want_replication,
                    topic_configs=topic_configs(s.spec, s.want_replication),
                )
                with contextlib.suppress(TopicAlreadyExistsError):  # created concurrently
                    await admin.create_topics([topic])
        finally:
            await admin.close()
        for _ in range(100):  # metadata propagates asynchronously (0 partitions at first)
            states = await describe(settings, prefix)
            if all(s.exists and s.partitions for s in states):
                break
            await asyncio.sleep(0.1)
    return states


def check(settings: Settings) -> Check:
    """The doctor's line for the run's topics."""
    prefix = settings.topics.prefix
    c = Check("topics", False, f"{prefix}.*")
    try:
        states = asyncio.run(asyncio.wait_for(describe(settings), 20))
    except Exception as exc:
        c.detail = f"cannot list topics: {type(exc).__name__}: {exc}"
        c.fix = "bring Kafka up first: `rollstream up`"
        return c
    problems = [p for s in states for p in s.problems()]
    c.healthy = not problems
    c.version = f"{sum(s.exists for s in states)}/{len(states)}"
    c.detail = "; ".join(problems) if problems else "all declared topics present"
    c.fix = "" if c.healthy else f"run `rollstream topics ensure --prefix {prefix}`"
    return c
