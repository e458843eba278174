"""Reading a topic by offset range or time window: the shared plumbing of replay, export,
audit and status.

A selection is one half-open offset range per partition, ``[start, end)``. Offsets
bound it directly; a time window bounds it through the broker's time index
(``offsets_for_times``: the first offset whose record timestamp is at or after the
instant). Reads are ``read_committed`` (aborted transactions never show) and use no
consumer group: nothing is committed, no running service is disturbed.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from services import kafka
from services.kafka import Record

if TYPE_CHECKING:
    from aiokafka import AIOKafkaConsumer, TopicPartition

    from services.settings import Settings

__all__ = ["Record", "Selection", "Span", "plan_span", "read", "read_topic", "records", "spans"]


@dataclass(frozen=True, slots=True)
class Span:
    """Offsets ``[start, end)`` of one partition."""

    partition: int
    start: int
    end: int

    @property
    def size(self) -> int:
        return max(0, self.end - self.start)


@dataclass(frozen=True, slots=True)
class Selection:
    """What to read of a topic: an offset range, a time window, or both (intersected)."""

    start_offset: int | None = None
    """First offset of each partition to read (inclusive)."""
    end_offset: int | None = None
    """Offset of each partition to stop before (exclusive)."""
    since_ms: int | None = None
    """Records with a timestamp at or after this instant (Unix milliseconds)."""
    until_ms: int | None = None
    """Records with a timestamp before this instant (Unix milliseconds)."""
    partitions: tuple[int, ...] | None = None
    """Only these partitions. None: all."""


def plan_span(
    partition: int,
    low: int,
    high: int,
    sel: Selection,
    since_offset: int | None = None,
    until_offset: int | None = None,
) -> Span:
    """The span of one partition (pure). `low`/`high` are the partition's first and end
    offsets; `since_offset`/`until_offset` what the time index answered for the window
    (None: no record at or after that instant, so the window reaches the end)."""
    start, end = low, high
    if sel.start_offset is not None:
        start = max(start, sel.start_offset)
    if sel.end_offset is not None:
        end = min(end, sel.end_offset)
    if sel.since_ms is not None:
        start = max(start, high if since_offset is None else since_offset)
    if sel.until_ms is not None and until_offset is not None:
        end = min(end, until_offset)
    return Span(partition, start, max(start, end))


def consumer(settings: Settings) -> AIOKafkaConsumer:
    """A group-less, read_committed consumer for reading spans (not started)."""
    return kafka.consumer(settings, "rollstream-read")


async def topic_exists(c: AIOKafkaConsumer, topic: str) -> bool:
    return topic in await c.topics()


async def spans(settings: Settings, c: AIOKafkaConsumer, topic: str, sel: Selection) -> list[Span]:
    """The span of every selected partition of `topic` (a started consumer `c`)."""
    from aiokafka import TopicPartition

    parts = await kafka.partitions(settings, topic)
    if sel.partitions is not None:
        missing = sorted(set(sel.partitions) - set(parts))
        if missing:
            raise ValueError(f"{topic} has no partition {missing} (it has {parts})")
        parts = [p for p in parts if p in sel.partitions]
    tps = [TopicPartition(topic, p) for p in parts]
    lows = await c.beginning_offsets(tps)
    highs = await c.end_offsets(tps)
    since = await _times(c, tps, sel.since_ms)
    until = await _times(c, tps, sel.until_ms)
    return [
        plan_span(tp.partition, lows[tp], highs[tp], sel, since.get(tp), until.get(tp))
        for tp in tps
    ]


async def _times(
    c: AIOKafkaConsumer, tps: list[TopicPartition], ms: int | None
) -> dict[TopicPartition, int | None]:
    if ms is None:
        return {}
    found = await c.offsets_for_times({tp: max(0, ms) for tp in tps})
    return {tp: (None if hit is None else hit.offset) for tp, hit in found.items()}


async def read(
    c: AIOKafkaConsumer, topic: str, selected: list[Span], timeout_s: float = 120.0
) -> AsyncIterator[Record]:
    """Every record of `selected`, partition by partition interleaved as fetched. Raises
    TimeoutError when the spans are not read within `timeout_s`."""
    from aiokafka import TopicPartition

    todo = {TopicPartition(topic, s.partition): s for s in selected if s.size}
    if not todo:
        return
    c.assign(list(todo))
    for tp, s in todo.items():
        c.seek(tp, s.start)
    deadline = asyncio.get_running_loop().time() + timeout_s
    while todo:
        if asyncio.get_running_loop().time() > deadline:
            raise TimeoutError(f"reading {topic} took over {timeout_s} s")
        batches = await c.getmany(*todo, timeout_ms=500, max_records=2000)
        for tp, msgs in batches.items():
            end = todo[tp].end if tp in todo else -1
            for m in msgs:
                if m.offset < end:
                    yield Record.of(m)
        for tp in list(todo):  # transaction markers take offsets: compare positions
            if await c.position(tp) >= todo[tp].end:
                del todo[tp]


async def records(
    settings: Settings,
    topic: str,
    sel: Selection | list[Span] | None = None,
    timeout_s: float = 120.0,
    *,
    missing_ok: bool = False,
    planned: Callable[[list[Span]], object] | None = None,
) -> AsyncIterator[Record]:
    """Every selected record of `topic`: a Selection (planned into spans now, then passed to
    `planned`) or spans planned before. A missing topic yields nothing with `missing_ok`,
    else raises ValueError."""
    c = consumer(settings)
    await c.start()
    try:
        if not await topic_exists(c, topic):
            if missing_ok:
                return
            raise ValueError(f"topic {topic} does not exist")
        if isinstance(sel, list):
            chosen = sel
        else:
            chosen = await spans(settings, c, topic, sel or Selection())
            if planned is not None:
                planned(chosen)
        async for rec in read(c, topic, chosen, timeout_s):
            yield rec
    finally:
        await c.stop()


async def read_topic(
    settings: Settings, topic: str, sel: Selection | None = None, timeout_s: float = 120.0
) -> list[Record]:
    """Every selected record of `topic` (empty when the topic does not exist)."""
    return [r async for r in records(settings, topic, sel, timeout_s, missing_ok=True)]
