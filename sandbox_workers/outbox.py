"""Per-partition, offset-ordered outbox of the sandbox worker (pure; no Kafka here).

Jobs finish out of order, but a partition's committed offset can only move over a
contiguous run of finished records. So a finished job's output waits here until every
earlier record of its partition is finished too; then the run's outputs and the offset
after it are published in one Kafka transaction. The published results are then always
exactly the committed offsets' records: a crash at any moment leaves either both or
neither, so a restarted worker neither loses nor repeats a result.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

P = TypeVar("P")  # a partition key (aiokafka TopicPartition in the service)


@dataclass
class Entry:
    offset: int
    outputs: list[Any] | None = None
    """None while the job runs; then what to publish (possibly nothing)."""
    key: str = ""
    """The idempotency key the entry claimed (request_id:attempt), if any."""


@dataclass
class Batch(Generic[P]):
    outputs: list[Any] = field(default_factory=list)
    offsets: dict[P, int] = field(default_factory=dict)
    """Offset to commit per partition: the next record to consume."""
    entries: dict[P, int] = field(default_factory=dict)
    """How many entries of each partition the batch covers."""

    def __bool__(self) -> bool:
        return bool(self.offsets)


class Outbox(Generic[P]):
    def __init__(self) -> None:
        self._parts: dict[P, deque[Entry]] = {}

    def add(self, partition: P, offset: int) -> Entry:
        """Track a consumed record (offsets of a partition arrive in increasing order)."""
        q = self._parts.setdefault(partition, deque())
        if q and offset <= q[-1].offset:
            raise ValueError(f"offset {offset} of {partition} after {q[-1].offset}")
        entry = Entry(offset)
        q.append(entry)
        return entry

    @staticmethod
    def finish(entry: Entry, outputs: list[Any]) -> None:
        entry.outputs = list(outputs)

    def ready(self) -> Batch[P]:
        """The finished prefix of every partition (not removed until `commit`)."""
        batch: Batch[P] = Batch()
        for part, q in self._parts.items():
            n = 0
            for entry in q:
                if entry.outputs is None:
                    break
                batch.outputs.extend(entry.outputs)
                n += 1
            if n:
                batch.entries[part] = n
                batch.offsets[part] = q[n - 1].offset + 1
        return batch

    def commit(self, batch: Batch[P]) -> list[Entry]:
        """Forget what `batch` published; returns those entries."""
        done = []
        for part, n in batch.entries.items():
            q = self._parts.get(part)
            if q is None:
                continue
            done += [q.popleft() for _ in range(min(n, len(q)))]
            if not q:
                del self._parts[part]
        return done

    def drop(self, partitions: list[P]) -> list[Entry]:
        """Forget revoked partitions (their unpublished work is redone by the new owner);
        returns the entries forgotten."""
        return [e for p in partitions for e in self._parts.pop(p, ())]

    def pending(self) -> int:
        return sum(len(q) for q in self._parts.values())

    def partitions(self) -> list[P]:
        return list(self._parts)
