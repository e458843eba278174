"""streams/batchsend.py: a batch's records grouped by (topic, partition) in order, with the
partitioner aiokafka's own `send` uses, one record batch per partition unless it is full."""

from __future__ import annotations

from typing import Any

from aiokafka.partitioner import DefaultPartitioner
from aiokafka.producer.message_accumulator import BatchBuilder

from streams.batchsend import BatchSender, by_partition


def test_records_keep_their_order_within_each_partition() -> None:
    choose = DefaultPartitioner()
    parts = {"t": [0, 1, 2, 3], "u": [0, 1]}
    records = [("t", f"k{i % 5}".encode(), f"v{i}".encode()) for i in range(40)]
    records += [("u", b"k1", b"u0"), ("t", b"k1", b"late")]
    groups = by_partition(records, parts, choose)
    assert len(groups) > 2
    for (topic, partition), rows in groups.items():
        mine = [(t, k, v) for t, k, v in records if t == topic]
        assert rows == [(k, v) for t, k, v in mine if choose(k, parts[t], parts[t]) == partition]
    assert sum(len(rows) for rows in groups.values()) == len(records)


class FakeProducer:
    """What BatchSender uses of aiokafka's producer, with small record batches."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, int, int]] = []

    async def partitions_for(self, topic: str) -> set[int]:
        return {1, 0, 2}

    def create_batch(self) -> BatchBuilder:
        return BatchBuilder(300, 0, is_transactional=False, key_serializer=None,
                            value_serializer=None)  # fmt: skip

    async def send_batch(self, batch: BatchBuilder, topic: str, *, partition: int) -> Any:
        self.sent.append((topic, partition, batch.record_count()))
        return ("ack", topic, partition, len(self.sent))


async def test_a_full_batch_is_sent_and_a_new_one_started_an_oversize_record_goes_alone() -> None:
    producer = FakeProducer()
    send = BatchSender(lambda: producer)
    records = [("t", b"same", b"x" * 100) for _ in range(5)] + [("t", b"same", b"y" * 1000)]
    acks = await send(records)
    partition = DefaultPartitioner()(b"same", [0, 1, 2], [0, 1, 2])
    counts = [n for _, p, n in producer.sent if p == partition]
    assert sum(counts) == 6 and len(counts) >= 3 and counts[-1] == 1  # the big one alone
    assert len(acks) == len(producer.sent)
