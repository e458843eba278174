"""What the learner's loop needs from Kafka, as small Protocols (no Kafka client here).

The loop's logic is tested against an in-memory double (tests/unit/test_learner_loop.py);
services/learner_kafka.py implements `LearnerIO` with aiokafka through services/kafka.py:
the consumer is assigned every partition of `rewards` (one learner reads them all) and
positioned explicitly from the checkpoint; it reads with ``isolation_level=read_committed``
and never auto-commits. Offsets are committed to the consumer group only after a checkpoint
holds them (for lag monitoring and generator pacing; the checkpoint is the truth). The
producer is idempotent with ``acks=all``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from schemas.records import ConsumedRecord

Record = ConsumedRecord
"""What the loop reads of a Kafka record (services.kafka.Record is one)."""


class RewardsReader(Protocol):
    """The `rewards` consumer: every partition, positioned by the learner."""

    async def seek(self, offsets: dict[int, int]) -> None:
        """Position every rewards partition: at `offsets[p]` when given, else at the
        group's committed offset, else at the beginning."""
        ...

    async def poll(self, timeout_s: float, max_records: int) -> Sequence[Record]: ...

    async def commit(self, offsets: dict[int, int]) -> None:
        """Commit next-offsets of rewards partitions to the consumer group."""
        ...


class TopicWriter(Protocol):
    """Sends to the learner's output topics, and reads back its last announcement."""

    async def send_and_wait(
        self, topic: str, value: bytes | None = None, key: bytes | None = None
    ) -> object: ...

    async def send_all(self, items: list[tuple[str, bytes | None, bytes]]) -> None:
        """Send (topic, key, value) records; return when every one is acknowledged."""
        ...

    async def last_value(self, topic: str, key: bytes) -> bytes | None:
        """The newest value under `key` on `topic` (read from the beginning to the end)."""
        ...


class LearnerIO(RewardsReader, TopicWriter, Protocol):
    """Everything the loop does with Kafka."""
