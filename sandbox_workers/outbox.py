"""The sandbox worker's outbox: what finished jobs publish, and the offsets to commit with
it (pure; no Kafka here).

Jobs finish out of order. A finished job's output is published at the next flush, whatever
is still running before it in its partition, so one slow job holds back no other result.
A partition's committed offset can only move over a contiguous run of answered records, so
each commit also carries, as its metadata (schemas/answered.py), the offsets past it that
are answered already. Outputs, offsets and metadata go in one Kafka transaction: a crash
at any moment leaves either all of them or none, and the worker that takes the partition
over (`inherit`) skips the records the metadata marks. No result is lost or repeated.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from schemas import answered

P = TypeVar("P")  # a partition key (aiokafka TopicPartition in the service)


@dataclass(eq=False)
class Entry:
    offset: int
    outputs: list[Any] | None = None
    """None while the job runs; then what to publish (possibly nothing)."""
    key: str = ""
    """The idempotency key the entry claimed (request_id:attempt), if any."""
    published: bool = False
    """Its outputs went out in a committed transaction."""


@dataclass
class Batch(Generic[P]):
    outputs: list[Any] = field(default_factory=list)
    offsets: dict[P, tuple[int, str]] = field(default_factory=dict)
    """Per partition: the offset to commit (the next record to consume) and its metadata
    (the answered offsets past it)."""
    entries: dict[P, list[Entry]] = field(default_factory=dict)
    """The entries whose outputs the batch publishes."""

    def __bool__(self) -> bool:
        return bool(self.offsets)


@dataclass
class _Partition:
    entries: deque[Entry] = field(default_factory=deque)
    """Consumed records not yet below the committed offset, in offset order."""
    answered: set[int] = field(default_factory=set)
    """Offsets at or past the committed one that a committed transaction answered (by this
    worker, or by the partition's previous owner: `inherit`)."""


class Outbox(Generic[P]):
    def __init__(self) -> None:
        self._parts: dict[P, _Partition] = {}

    def known(self, partition: P) -> bool:
        """Whether the partition was inherited (or first added) since it was last dropped."""
        return partition in self._parts

    def inherit(self, partition: P, done: set[int]) -> None:
        """Take a partition over: `done` are the offsets its last commit marks answered."""
        self._parts[partition] = _Partition(answered=set(done))

    def add(self, partition: P, offset: int) -> Entry:
        """Track a consumed record (offsets of a partition arrive in increasing order). A
        record answered already comes back finished, with nothing to publish."""
        part = self._parts.setdefault(partition, _Partition())
        q = part.entries
        if q and offset <= q[-1].offset:
            raise ValueError(f"offset {offset} of {partition} after {q[-1].offset}")
        entry = Entry(offset, outputs=[] if offset in part.answered else None)
        q.append(entry)
        return entry

    @staticmethod
    def finish(entry: Entry, outputs: list[Any]) -> None:
        entry.outputs = list(outputs)

    def ready(self) -> Batch[P]:
        """Every finished, unpublished entry, and per partition the offset and metadata to
        commit with them (nothing is removed until `commit`)."""
        batch: Batch[P] = Batch()
        for key, part in self._parts.items():
            if not part.entries:
                continue
            limit = part.entries[0].offset + answered.MAX_SPAN  # the metadata's reach
            new = [
                e
                for e in part.entries
                if e.outputs is not None and not e.published and e.offset < limit
            ]
            if not new:
                continue
            ids, point = {id(e) for e in new}, part.entries[-1].offset + 1
            for e in part.entries:
                if not (e.published or id(e) in ids):
                    point = e.offset
                    break
            done = part.answered | {e.offset for e in new}
            batch.offsets[key] = (point, answered.encode(point, done))
            batch.entries[key] = new
            for e in new:
                batch.outputs.extend(e.outputs or [])
        return batch

    def commit(self, batch: Batch[P]) -> list[Entry]:
        """Record that `batch` was published; returns its entries."""
        out: list[Entry] = []
        for key, entries in batch.entries.items():
            out += entries
            for e in entries:
                e.published, e.outputs = True, []
            part = self._parts.get(key)
            if part is None:  # dropped meanwhile
                continue
            point = batch.offsets[key][0]
            part.answered = {o for o in part.answered | {e.offset for e in entries} if o >= point}
            while part.entries and part.entries[0].published:
                part.entries.popleft()
        return out

    def drop(self, partitions: list[P]) -> list[Entry]:
        """Forget revoked partitions (their unpublished work is redone by the new owner);
        returns the entries forgotten."""
        gone = [self._parts.pop(p) for p in partitions if p in self._parts]
        return [e for part in gone for e in part.entries]

    def pending(self) -> int:
        """Consumed records not yet below a committed offset (published ones included)."""
        return sum(len(p.entries) for p in self._parts.values())

    def partitions(self) -> list[P]:
        return list(self._parts)
