"""The learner's Kafka plumbing, behind a small interface (`LearnerIO`) so the loop's logic
can be tested against an in-memory double.

The consumer is assigned every partition of `rewards` (one learner reads them all) and
positioned explicitly from the checkpoint; it reads with ``isolation_level=read_committed``
and never auto-commits. Offsets are committed to the consumer group only after a checkpoint
holds them (for lag monitoring and generator pacing; the checkpoint is the truth).
The producer is idempotent with ``acks=all``.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any, Protocol

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Record:
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None


class LearnerIO(Protocol):
    async def seek(self, offsets: dict[int, int]) -> None:
        """Position every rewards partition: at `offsets[p]` when given, else at the
        group's committed offset, else at the beginning."""
        ...

    async def poll(self, timeout_s: float, max_records: int) -> list[Record]: ...

    async def commit(self, offsets: dict[int, int]) -> None:
        """Commit next-offsets of rewards partitions to the consumer group."""
        ...

    async def send_and_wait(
        self, topic: str, value: bytes | None = None, key: bytes | None = None
    ) -> object: ...

    async def send_all(self, items: list[tuple[str, bytes | None, bytes]]) -> None:
        """Send (topic, key, value) records; return when every one is acknowledged."""
        ...

    async def last_value(self, topic: str, key: bytes) -> bytes | None:
        """The newest value under `key` on `topic` (read from the beginning to the end)."""
        ...


async def partitions_of(consumer: Any, topic: str, timeout_s: float = 15.0) -> list[int]:
    """Partition ids of `topic`, fetching its metadata if the consumer has none yet
    (a consumer that assigns partitions by hand only knows the topics it was told of)."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        parts = consumer.partitions_for_topic(topic)
        if parts:
            return sorted(parts)
        if asyncio.get_running_loop().time() > deadline:
            raise RuntimeError(f"topic {topic} has no partitions (does it exist?)")
        consumer._client.add_topic(topic)  # aiokafka has no public call for this
        await consumer._client.force_metadata_update()
        await asyncio.sleep(0.1)


class KafkaIO:
    def __init__(self, bootstrap: str, rewards_topic: str, group_id: str, client_id: str) -> None:
        self.bootstrap = bootstrap
        self.topic = rewards_topic
        self.group_id = group_id
        self.client_id = client_id
        self.consumer: object = None
        self.producer: object = None
        self.partitions: list[int] = []

    async def start(self) -> None:
        from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

        self.producer = p = AIOKafkaProducer(
            bootstrap_servers=self.bootstrap,
            client_id=self.client_id,
            acks="all",
            enable_idempotence=True,
            max_request_size=8 * 1024 * 1024,
        )
        await p.start()
        self.consumer = c = AIOKafkaConsumer(
            bootstrap_servers=self.bootstrap,
            client_id=self.client_id,
            group_id=self.group_id,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            isolation_level="read_committed",
            fetch_max_bytes=32 * 1024 * 1024,
        )
        await c.start()
        self.partitions = await partitions_of(c, self.topic)
        c.assign([TopicPartition(self.topic, p) for p in self.partitions])

    async def stop(self) -> None:
        for client in (self.consumer, self.producer):
            if client is not None:
                await client.stop()  # type: ignore[attr-defined]

    def _tp(self, partition: int) -> object:
        from aiokafka import TopicPartition

        return TopicPartition(self.topic, partition)

    async def seek(self, offsets: dict[int, int]) -> None:
        c = self.consumer
        for p in self.partitions:
            tp = self._tp(p)
            if p in offsets:
                c.seek(tp, offsets[p])  # type: ignore[attr-defined]
                continue
            committed = await c.committed(tp)  # type: ignore[attr-defined]
            if committed is not None:
                c.seek(tp, committed)  # type: ignore[attr-defined]
            else:
                await c.seek_to_beginning(tp)  # type: ignore[attr-defined]

    async def poll(self, timeout_s: float, max_records: int) -> list[Record]:
        batches = await self.consumer.getmany(  # type: ignore[attr-defined]
            timeout_ms=int(timeout_s * 1000), max_records=max_records
        )
        return [
            Record(m.topic, m.partition, m.offset, m.key, m.value)
            for msgs in batches.values()
            for m in msgs
        ]

    async def commit(self, offsets: dict[int, int]) -> None:
        if offsets:
            await self.consumer.commit({self._tp(p): o for p, o in offsets.items()})  # type: ignore[attr-defined]

    async def send_and_wait(
        self, topic: str, value: bytes | None = None, key: bytes | None = None
    ) -> object:
        return await self.producer.send_and_wait(topic, value=value, key=key)  # type: ignore[attr-defined]

    async def send_all(self, items: list[tuple[str, bytes | None, bytes]]) -> None:
        futures = [
            await self.producer.send(topic, value=v, key=k)  # type: ignore[attr-defined]
            for topic, k, v in items
        ]
        if futures:
            await asyncio.gather(*futures)

    async def last_value(self, topic: str, key: bytes, timeout_s: float = 60.0) -> bytes | None:
        from aiokafka import AIOKafkaConsumer, TopicPartition

        c = AIOKafkaConsumer(
            bootstrap_servers=self.bootstrap,
            enable_auto_commit=False,
            isolation_level="read_committed",
        )
        await c.start()
        try:
            tps = [TopicPartition(topic, p) for p in await partitions_of(c, topic)]
            c.assign(tps)
            await c.seek_to_beginning(*tps)
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
