"""The one Kafka adapter of rollstream (DESIGN.md section 10).

Everything that talks to Kafka through aiokafka is built here, from the settings: the
idempotent producer (acks=all), the transactional producer, consumers (group or group-less,
read_committed, manual commits), the admin client; topic names and consumer group ids from
the registry in schemas/topics.py; partitions through the public admin API (cached per
process), end-offset counts and a group's committed offsets; the `Follower` that tails
whole topics in a task; the one `Record` type; the one dead-letter sender. Lower packages
never import this module: they declare small Protocols (the learner's LearnerIO, the
sandbox worker's WorkerIO ...) and services/ passes them these clients.

aiokafka is imported inside the functions so that `rollstream --help` stays instant.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from schemas import answered, topics
from schemas.deadletter import publish_dead_letter
from schemas.records import ConsumedRecord

if TYPE_CHECKING:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
    from aiokafka.admin import AIOKafkaAdminClient

    from services.settings import Settings

MAX_REQUEST_BYTES = 8 << 20
"""Largest record a producer sends (bigger payloads travel by claim check)."""
FETCH_PARTITION_BYTES = 16 << 20
FETCH_BYTES = 64 << 20

log = logging.getLogger("rollstream.kafka")


def _quiet(level: int = logging.WARNING) -> None:
    logging.getLogger("aiokafka").setLevel(level)


def topic(settings: Settings, spec: topics.TopicSpec, prefix: str | None = None) -> str:
    """Full name of a registry topic for the run's (or the given) prefix."""
    return spec.full_name(settings.topics.prefix if prefix is None else prefix)


def group(
    settings: Settings,
    g: topics.ConsumerGroup,
    policy: str | None = None,
    prefix: str | None = None,
) -> str:
    """Full id of a registry consumer group (per policy for the learner)."""
    return g.full_id(settings.topics.prefix if prefix is None else prefix, policy)


def producer(
    settings: Settings,
    client_id: str,
    *,
    transactional_id: str | None = None,
    **extra: Any,
) -> AIOKafkaProducer:
    """An idempotent producer with acks=all (DESIGN.md section 3); transactional when
    `transactional_id` is given. Not started."""
    from aiokafka import AIOKafkaProducer

    _quiet()
    options: dict[str, Any] = {
        "client_id": client_id,
        "acks": "all",
        "enable_idempotence": True,
        "linger_ms": 5,
        "max_request_size": MAX_REQUEST_BYTES,
    }
    if transactional_id is not None:
        options["transactional_id"] = transactional_id
    options.update(extra)
    return AIOKafkaProducer(bootstrap_servers=settings.kafka.endpoint, **options)


def consumer(
    settings: Settings,
    client_id: str,
    *topic_names: str,
    group_id: str | None = None,
    offset_reset: Literal["earliest", "latest"] = "earliest",
    **extra: Any,
) -> AIOKafkaConsumer:
    """A read_committed consumer that never commits by itself. With `group_id` it joins that
    group (and subscribes to `topic_names`, if given); without, partitions are assigned by
    hand (`assign_all`). Not started."""
    from aiokafka import AIOKafkaConsumer

    _quiet()
    options: dict[str, Any] = {
        "client_id": client_id,
        "group_id": group_id,
        "enable_auto_commit": False,
        "isolation_level": "read_committed",
        "auto_offset_reset": offset_reset,
        "max_partition_fetch_bytes": FETCH_PARTITION_BYTES,
        "fetch_max_bytes": FETCH_BYTES,
    }
    options.update(extra)
    return AIOKafkaConsumer(*topic_names, bootstrap_servers=settings.kafka.endpoint, **options)


def admin(settings: Settings, request_timeout_ms: int = 15000) -> AIOKafkaAdminClient:
    """An admin client (not started)."""
    from aiokafka.admin import AIOKafkaAdminClient

    _quiet(logging.CRITICAL)
    return AIOKafkaAdminClient(
        bootstrap_servers=settings.kafka.endpoint, request_timeout_ms=request_timeout_ms
    )


_PARTITIONS: dict[tuple[str, str], list[int]] = {}
"""Partition ids already looked up, by (bootstrap, topic): a topic's partitions are fixed
at creation (topics ensure), and pacing and backlogs count end offsets every half second."""


async def partitions(settings: Settings, name: str, timeout_s: float = 15.0) -> list[int]:
    """Partition ids of topic `name`, through the admin API's metadata (retried until the
    topic exists or `timeout_s` passes: a topic just created takes a moment to appear)."""
    key = (settings.kafka.endpoint, name)
    if key in _PARTITIONS:
        return list(_PARTITIONS[key])
    parts = await _describe_partitions(settings, name, timeout_s)
    _PARTITIONS[key] = parts
    return list(parts)


async def _describe_partitions(settings: Settings, name: str, timeout_s: float) -> list[int]:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    client = admin(settings)
    await client.start()
    try:
        while True:
            found = await client.describe_topics([name])
            parts = sorted(
                int(p["partition"])
                for t in found
                if t.get("topic") == name and not t.get("error_code")
                for p in t.get("partitions", ())
            )
            if parts:
                return parts
            if loop.time() > deadline:
                raise RuntimeError(f"topic {name} has no partitions (does it exist?)")
            await asyncio.sleep(0.2)
    finally:
        await client.close()


async def topic_partitions(settings: Settings, names: list[str]) -> list[TopicPartition]:
    """Every partition of the topics, as TopicPartitions."""
    from aiokafka import TopicPartition

    return [TopicPartition(n, p) for n in names for p in await partitions(settings, n)]


async def assign_all(
    settings: Settings,
    client: AIOKafkaConsumer,
    names: list[str],
    at: Literal["beginning", "end"] = "beginning",
) -> list[TopicPartition]:
    """Assign every partition of the topics to a group-less consumer, positioned at their
    beginning or end (resolved now, before anything else is sent)."""
    tps = await topic_partitions(settings, names)
    client.assign(tps)
    if at == "end":
        await client.seek_to_end(*tps)
        for tp in tps:
            await client.position(tp)
    else:
        await client.seek_to_beginning(*tps)
    return tps


async def record_count(settings: Settings, client: AIOKafkaConsumer, name: str) -> int:
    """Records ever written to a topic (the sum of its partitions' end offsets). Exact for
    topics written without transactions (trajectories, tasks)."""
    tps = await topic_partitions(settings, [name])
    ends = await client.end_offsets(tps)
    return int(sum(ends.values()))


async def committed(admin_client: AIOKafkaAdminClient, group_id: str, name: str) -> int:
    """Offsets a consumer group has committed on topic `name`, summed over partitions, plus
    the records past them its commits mark answered (the sandbox workers', schemas/answered.py):
    what it has taken of the records ever written."""
    offsets = await admin_client.list_consumer_group_offsets(group_id)
    return sum(
        taken(meta.offset, meta.metadata) for tp, meta in offsets.items() if tp.topic == name
    )


def taken(offset: int, metadata: str | None) -> int:
    """Records of a partition a commit accounts for: those below its offset and those its
    metadata marks answered past it."""
    return max(0, offset) + answered.count(metadata or "")


class Follower:
    """A group-less consumer following whole topics (from their beginning or their end) and
    the task that reads it, batch by batch: the weights watcher, the sandbox client and the
    demo monitor. Kafka trouble is logged and the read retried a second later."""

    def __init__(
        self,
        settings: Settings,
        client_id: str,
        names: list[str],
        at: Literal["beginning", "end"] = "beginning",
        *,
        timeout_ms: int = 500,
        max_records: int | None = None,
    ) -> None:
        self.settings, self.client_id, self.names, self.at = settings, client_id, names, at
        self.timeout_ms, self.max_records = timeout_ms, max_records
        self.consumer: AIOKafkaConsumer | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self, on_batch: Callable[[list[KafkaRecord]], Awaitable[None]]) -> None:
        """Start the consumer, assign the partitions, then call `on_batch` with every batch
        of records fetched (empty ones too: a tick about every `timeout_ms`)."""
        self.consumer = consumer(self.settings, self.client_id)
        await self.consumer.start()
        await assign_all(self.settings, self.consumer, self.names, self.at)
        self._task = asyncio.create_task(self._run(self.consumer, on_batch), name=self.client_id)

    async def _run(
        self, c: AIOKafkaConsumer, on_batch: Callable[[list[KafkaRecord]], Awaitable[None]]
    ) -> None:
        while True:
            try:
                batches = await c.getmany(timeout_ms=self.timeout_ms, max_records=self.max_records)
                await on_batch([r for rs in batches.values() for r in rs])
            except Exception:
                log.exception("%s: reading %s failed; retrying", self.client_id, self.names)
                await asyncio.sleep(1.0)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self.consumer is not None:
            await self.consumer.stop()


KafkaRecord = ConsumedRecord
"""What a record read from Kafka offers (an aiokafka ConsumerRecord, a Record)."""


@dataclass(frozen=True, slots=True)
class Record:
    """One Kafka record as read: the only record type the services pass around."""

    topic: str
    partition: int
    offset: int
    timestamp_ms: int
    key: bytes | None
    value: bytes | None

    @classmethod
    def of(cls, msg: KafkaRecord) -> Record:
        """From an aiokafka ConsumerRecord (or anything with the same attributes)."""
        return cls(
            topic=msg.topic,
            partition=msg.partition,
            offset=msg.offset,
            timestamp_ms=int(getattr(msg, "timestamp", 0) or 0),
            key=msg.key,
            value=msg.value,
        )


class DeadLetters:
    """The dead-letter sender of one consumer: count, publish to `{p}.dlq` and wait for the
    broker's ack before returning, so the caller may move its offset (DESIGN.md section 2)."""

    def __init__(
        self,
        settings: Settings,
        producer: AIOKafkaProducer,
        consumer: str,
        on_send: Callable[[], object] | None = None,
        prefix: str | None = None,
    ) -> None:
        self.topic = topic(settings, topics.DLQ, prefix)
        self.producer = producer
        self.consumer = consumer
        """Who dead-letters (recorded in the letter)."""
        self.on_send = on_send
        """Called per dead letter (a metrics counter)."""
        self.count = 0

    async def send(
        self,
        record: KafkaRecord | tuple[int, str | bytes],
        reason: str,
        error: BaseException | None = None,
        *,
        source: str = "",
    ) -> None:
        """Dead-letter a Kafka record (anything with topic, partition, offset, key, value),
        or, with `source` (a file name), a line of that file: record is then (number, text)."""
        self.count += 1
        if self.on_send is not None:
            self.on_send()
        key: bytes | None
        value: bytes | None
        if isinstance(record, tuple):
            number, text = record
            where, partition, offset = source, 0, int(number)
            key, value = None, text.encode() if isinstance(text, str) else bytes(text)
        else:
            where, partition, offset = record.topic, record.partition, record.offset
            key, value = record.key, record.value
        await publish_dead_letter(
            self.producer,
            self.topic,
            reason=reason,
            key=key,
            value=value,
            consumer=self.consumer,
            error=error,
            source_topic=where,
            partition=partition,
            offset=offset,
        )
