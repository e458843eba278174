"""Sending a dispatcher batch's records as Kafka record batches, one delivery future per
record batch instead of one per record (streams/app.py wires it to the app's producer).

aiokafka's `send` costs, per record, a metadata wait, the partitioner, a future and the
accumulator's bookkeeping: about an eighth of the dispatcher's CPU at full load. Here the
records are grouped by (topic, partition), in order, with the partitioner aiokafka's
`send` would use (murmur2 of the key over all partitions, a random one without a key),
appended to `BatchBuilder`s and submitted with `send_batch`. Per-partition order is the
order of `records`: within a partition the record batches are submitted in order, and the
accumulator sends a partition's batches in order. A record larger than a batch goes alone
in a batch of its own (an empty batch takes any record).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

Record = tuple[str, bytes | None, bytes | None]
Partitioner = Callable[[bytes | None, list[int], list[int]], int]


def by_partition(
    records: Sequence[Record], partitions: dict[str, list[int]], choose: Partitioner
) -> dict[tuple[str, int], list[tuple[bytes | None, bytes | None]]]:
    """(topic, partition) -> its (key, value)s in the order of `records`; the groups in the
    order of their first record. `partitions`: every topic's partitions, sorted."""
    out: dict[tuple[str, int], list[tuple[bytes | None, bytes | None]]] = {}
    for topic, key, value in records:
        every = partitions[topic]
        out.setdefault((topic, choose(key, every, every)), []).append((key, value))
    return out


class BatchSender:
    """async (records) -> their delivery futures, over an aiokafka producer (`producer()`
    gives it, so a producer restarted by faust is picked up)."""

    def __init__(self, producer: Callable[[], Any]) -> None:
        from aiokafka.partitioner import DefaultPartitioner

        self.producer = producer
        self.choose: Partitioner = DefaultPartitioner()

    async def __call__(self, records: Sequence[Record]) -> list[Any]:
        producer = self.producer()
        partitions = {}
        for topic in {topic for topic, _, _ in records}:
            partitions[topic] = sorted(await producer.partitions_for(topic))
        acks = []
        for (topic, partition), rows in by_partition(records, partitions, self.choose).items():
            batch = producer.create_batch()
            for key, value in rows:
                if batch.append(key=key, value=value, timestamp=None) is None:
                    acks.append(await producer.send_batch(batch, topic, partition=partition))
                    batch = producer.create_batch()
                    batch.append(key=key, value=value, timestamp=None)  # an empty one fits
            acks.append(await producer.send_batch(batch, topic, partition=partition))
        return acks
