"""The dispatcher agent's batching (streams/intake.py through streams/app.py's agent) on a
fake faust stream: a rebalance that clears the queue while the agent holds a batch must
not leave that batch unacked (faust waits for every handed-out event to be acked before
the rebalance goes on, so an unacked held batch stopped the dispatcher for good)."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Sequence
from typing import Any

import pytest

from streams.app import _batches


class FakeDispatcher:
    """Records the batches it stages and settles."""

    def __init__(self, fail_on: int | None = None) -> None:
        self.inflight: deque[Any] = deque()
        self.staged: list[list[int]] = []
        self.settled: list[list[int]] = []
        self.fail_on = fail_on

    async def stage(self, events: Sequence[Any]) -> list[int]:
        batch = list(events)
        if self.fail_on is not None and self.fail_on in batch:
            raise RuntimeError(f"cannot stage {self.fail_on}")
        await asyncio.sleep(0)
        self.staged.append(batch)
        return batch

    async def settle(self, batch: list[int]) -> None:
        await asyncio.sleep(0.001)
        self.settled.append(batch)

    async def drain(self) -> None:
        while self.inflight:
            await self.inflight.popleft()


class Queue:
    def __init__(self) -> None:
        self.queued = 0
        self._queue: deque[Any] = deque()  # what streams.app.keep_fetched_on_resume filters

    def clear(self) -> None:
        self._queue.clear()

    def empty(self) -> bool:
        return self.queued == 0


class FakeStream:
    """faust's manual-ack stream as the agent sees it. `events` come in bursts; after each
    burst but the last, a rebalance clears the queue (the agent was told more was queued)
    and the stream hands out nothing until every event handed out so far is acked."""

    def __init__(self, bursts: list[list[int]]) -> None:
        self.bursts = bursts
        self.channel = type("Channel", (), {"queue": Queue()})()
        flow = type("Flow", (), {"is_active": lambda self: True})()
        consumer = type("Consumer", (), {"callback": None, "wait_first": None})()
        self.app = type(
            "App", (), {"flow_control": flow, "consumer_generation_id": 1, "consumer": consumer}
        )()
        self.acked: list[int] = []
        self.handed = 0
        self.all_acked = asyncio.Event()

    def noack(self) -> FakeStream:
        return self

    async def ack(self, event: int) -> bool:
        self.acked.append(event)
        if len(self.acked) == self.handed:
            self.all_acked.set()
        return True

    async def events(self) -> AsyncIterator[int]:
        queue = self.channel.queue
        for i, burst in enumerate(self.bursts):
            for j, event in enumerate(burst):
                # the agent sees more queued after every event of a burst, also the last
                # of a burst that a rebalance then clears
                queue.queued = 1 if (j < len(burst) - 1 or i < len(self.bursts) - 1) else 0
                self.handed += 1
                self.all_acked.clear()
                yield event
            if i < len(self.bursts) - 1:
                queue.queued = 0  # cleared by the rebalance
                await self.all_acked.wait()  # faust's wait_empty, then the stream resumes


async def run_agent(d: FakeDispatcher, stream: FakeStream, gather_s: float = 0.003) -> None:
    agent = _batches(d, 1000, 4, gather_s)  # type: ignore[arg-type]
    await asyncio.wait_for(agent(stream), timeout=5)


@pytest.mark.parametrize("gather_s", [0.0, 0.003])
async def test_a_held_batch_is_staged_and_acked_when_a_rebalance_clears_the_queue(
    gather_s: float,
) -> None:
    d, stream = FakeDispatcher(), FakeStream([[1, 2, 3], [4, 5], [6]])
    await run_agent(d, stream, gather_s)
    assert stream.acked == [1, 2, 3, 4, 5, 6]
    assert [e for b in d.staged for e in b] == [1, 2, 3, 4, 5, 6]
    assert d.settled == d.staged
    assert d.staged[0] == [1, 2, 3]  # the held batch went out whole, before the rest


async def test_a_burst_is_one_batch() -> None:
    d, stream = FakeDispatcher(), FakeStream([list(range(50))])
    await run_agent(d, stream)
    assert d.staged == [list(range(50))]
    assert stream.acked == list(range(50))


async def test_a_held_batch_that_fails_to_stage_fails_the_agent() -> None:
    d, stream = FakeDispatcher(fail_on=2), FakeStream([[1, 2], [3]])
    with pytest.raises(RuntimeError, match="cannot stage 2"):
        await run_agent(d, stream, 0.0)
    assert stream.acked == []  # nothing pretends to be handled


async def test_a_batch_that_fails_to_stage_fails_the_agent() -> None:
    d, stream = FakeDispatcher(fail_on=3), FakeStream([[1, 2, 3]])
    with pytest.raises(RuntimeError, match="cannot stage 3"):
        await run_agent(d, stream, 0.0)
    assert stream.acked == []


class TrickleStream(FakeStream):
    """Events `gap_s` apart, the queue always saying more is coming (a slow fetcher)."""

    def __init__(self, n: int, gap_s: float) -> None:
        super().__init__([list(range(n))])
        self.gap_s = gap_s
        self.staged_before: list[int] = []
        """How many batches were staged when each event was handed out."""

    async def events(self) -> AsyncIterator[int]:
        self.channel.queue.queued = 1
        for event in self.bursts[0]:
            await asyncio.sleep(self.gap_s)
            self.handed += 1
            yield event
        self.channel.queue.queued = 0


async def test_events_that_keep_coming_stay_one_batch_past_the_hold_time() -> None:
    d = FakeDispatcher()
    stream = TrickleStream(12, 0.004)  # 48 ms in all, more than HOLD_S, gaps below it
    agent = _batches(d, 1000, 4, 0.0)  # type: ignore[arg-type]
    await asyncio.wait_for(agent(stream), timeout=5)
    assert d.staged == [list(range(12))]
    assert stream.acked == list(range(12))


async def test_a_batch_held_past_the_hold_time_is_staged_while_the_agent_waits() -> None:
    d = FakeDispatcher()
    stream = TrickleStream(3, 0.06)  # each gap longer than HOLD_S
    agent = _batches(d, 1000, 4, 0.0)  # type: ignore[arg-type]
    await asyncio.wait_for(agent(stream), timeout=5)
    assert d.staged == [[0], [1], [2]]  # each staged by the timer before the next came
    assert stream.acked == [0, 1, 2]
