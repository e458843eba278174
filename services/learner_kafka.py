"""The learner's Kafka IO: `learner.io.LearnerIO` on aiokafka, built by services/kafka.py.

The consumer joins the learner's group (schemas.topics.LEARNER, one per policy) only to
commit offsets: it is assigned every partition of `rewards` by hand and positioned from
the checkpoint (learner/io.py has the contract). The producer is the idempotent acks=all
one of services/kafka.py.

Committed offsets are a floor: `seek` never positions before the group's committed offset
and `commit` never moves it back. Records below it were trained or dropped and their
ledger entries sent by an earlier flush; a learner resuming from an older checkpoint (the
newest one corrupt) would otherwise train them, and write their ledger entries, twice.
Such skipped records are logged (their ledger entries already say what happened).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from schemas import topics
from services import kafka

if TYPE_CHECKING:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

    from services.settings import Settings

FETCH_BYTES = 32 << 20
log = logging.getLogger(__name__)


class KafkaIO:
    """The rewards consumer and the producer of one learner (start, then use, then stop)."""

    def __init__(self, settings: Settings, policy: str) -> None:
        self.settings = settings
        self.topic = kafka.topic(settings, topics.REWARDS)
        self.group_id = kafka.group(settings, topics.LEARNER, policy)
        self.client_id = f"rollstream-learner-{policy}"
        self._consumer: AIOKafkaConsumer | None = None
        self._producer: AIOKafkaProducer | None = None
        self.partitions: list[int] = []
        self.floor: dict[int, int] = {}
        """Per partition, the group's committed offset (read at seek, raised by commit)."""
        self._floor_read = False
        self.guard: Callable[[], Awaitable[None]] | None = None
        """Awaited before every write (announcement, outbox, commit): the learner's lease
        check (services/learner_lease.py), which raises when this learner is fenced."""

    @property
    def consumer(self) -> AIOKafkaConsumer:
        if self._consumer is None:
            raise RuntimeError("KafkaIO is not started")
        return self._consumer

    @property
    def producer(self) -> AIOKafkaProducer:
        if self._producer is None:
            raise RuntimeError("KafkaIO is not started")
        return self._producer

    async def start(self) -> None:
        from aiokafka import TopicPartition

        self._producer = kafka.producer(self.settings, self.client_id)
        await self._producer.start()
        self._consumer = kafka.consumer(
            self.settings, self.client_id, group_id=self.group_id, fetch_max_bytes=FETCH_BYTES
        )
        await self._consumer.start()
        self.partitions = await kafka.partitions(self.settings, self.topic)
        self._consumer.assign([TopicPartition(self.topic, p) for p in self.partitions])

    async def stop(self) -> None:
        for client in (self._consumer, self._producer):
            if client is not None:
                await client.stop()

    def _tp(self, partition: int) -> TopicPartition:
        from aiokafka import TopicPartition

        return TopicPartition(self.topic, partition)

    async def _read_floor(self) -> None:
        for p in self.partitions:
            committed = await self.consumer.committed(self._tp(p))
            if committed is not None:
                self.floor[p] = max(committed, self.floor.get(p, 0))
        self._floor_read = True

    async def seek(self, offsets: dict[int, int]) -> None:
        await self._read_floor()
        for p in self.partitions:
            tp, committed = self._tp(p), self.floor.get(p)
            start = offsets.get(p, committed)
            if committed is not None and start is not None and start < committed:
                log.warning(
                    "%s: checkpoint offset %d is behind the committed %d (an older checkpoint"
                    " resumed): skipping %d records already in the ledger",
                    tp, start, committed, committed - start,
                )  # fmt: skip
                start = committed
            if start is None:
                await self.consumer.seek_to_beginning(tp)
            else:
                self.consumer.seek(tp, start)

    async def poll(self, timeout_s: float, max_records: int) -> list[kafka.Record]:
        batches = await self.consumer.getmany(
            timeout_ms=int(timeout_s * 1000), max_records=max_records
        )
        return [kafka.Record.of(m) for msgs in batches.values() for m in msgs]

    async def _guarded(self) -> None:
        if self.guard is not None:
            await self.guard()

    async def commit(self, offsets: dict[int, int]) -> None:
        await self._guarded()
        if not self._floor_read:  # a restart's first flush comes before its seek
            await self._read_floor()
        ahead = {p: max(o, self.floor.get(p, 0)) for p, o in offsets.items()}
        if ahead:
            await self.consumer.commit({self._tp(p): o for p, o in ahead.items()})
            self.floor.update(ahead)

    async def send_and_wait(
        self, topic: str, value: bytes | None = None, key: bytes | None = None
    ) -> object:
        await self._guarded()
        return await self.producer.send_and_wait(topic, value=value, key=key)

    async def send_all(self, items: list[tuple[str, bytes | None, bytes]]) -> None:
        await self._guarded()
        futures = [await self.producer.send(topic, value=v, key=k) for topic, k, v in items]
        if futures:
            await asyncio.gather(*futures)

    async def last_value(self, topic: str, key: bytes) -> bytes | None:
        return await last_value(self.settings, topic, key)


async def last_value(
    settings: Settings, topic: str, key: bytes, timeout_s: float = 60.0
) -> bytes | None:
    """The newest value under `key` on `topic`, read from its beginning to its end by a
    group-less consumer (the learner's last announcement on `weights`)."""
    c = kafka.consumer(settings, "rollstream-last-value")
    await c.start()
    try:
        tps = await kafka.assign_all(settings, c, [topic])
        ends = await c.end_offsets(tps)
        found: bytes | None = None
        deadline = asyncio.get_running_loop().time() + timeout_s
        while [tp for tp in tps if await c.position(tp) < ends[tp]]:
            if asyncio.get_running_loop().time() > deadline:
                raise TimeoutError(f"reading {topic} to its end took over {timeout_s} s")
            batches = await c.getmany(timeout_ms=1000)
            for msgs in batches.values():
                for m in msgs:
                    if m.key == key and m.value is not None:
                        found = m.value
        return found
    finally:
        await c.stop()
