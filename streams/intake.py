"""The agent's intake: events gathered into adaptive batches, staged in order, settled in
the background (streams/app.py runs it over faust's stream; no faust in here).

Events are gathered while more are already queued, up to `most`; when the queue runs dry
the agent waits `gather_s` once for a trickle to join (a burst never waits). A batch is
staged (transitions run, records sent) and settles in the background, strictly after the
batch before it (acks awaited, states stored, only then its events acked), up to `depth`
batches in flight.

No event is ever held while the agent waits for the next one. A rebalance suspends the
stream and clears its queue *between* the agent's "more is queued" check and its next
read; faust then waits (without a time limit) until every event already handed out is
acked before it lets the rebalance go on. An event held in an unstaged batch is never
acked while the agent waits for a next event that cannot come: the dispatcher stopped
consuming for good, lag left, out of the group (faust-streaming issue #629 looks the
same). So a batch held longer than `HOLD_S` while the agent waits is staged by a timer,
under the lock that keeps batches in order.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Sequence
from typing import Any, Protocol

log = logging.getLogger("rollstream.dispatcher")

HOLD_S = 0.02
"""Longest an unstaged batch waits while the agent waits for the next event (a queued
event arrives in microseconds; a timer that fires early only makes a smaller batch)."""


class Stages(Protocol):
    """What the intake drives (streams.dispatcher.Dispatcher)."""

    inflight: Any
    """Tasks settling the batches in flight, oldest first."""

    async def stage(self, events: Sequence[Any]) -> Any: ...

    async def settle(self, batch: Any) -> None: ...


class Acks(Protocol):
    """The manual-ack stream (faust's `stream.noack()`)."""

    async def ack(self, event: Any) -> Any: ...


class Queue(Protocol):
    def empty(self) -> bool: ...


class Intake:
    """One agent's batching (module docstring)."""

    def __init__(
        self, d: Stages, acks: Acks, *, most: int, depth: int, gather_s: float, hold_s: float
    ) -> None:
        self.d, self.acks = d, acks
        self.most, self.depth, self.gather_s, self.hold_s = most, depth, gather_s, hold_s
        self.pending: list[Any] = []
        self.lock = asyncio.Lock()
        self.timer: asyncio.TimerHandle | None = None
        self.last = 0.0
        """Loop time the agent last took an event (the hold timer measures from it)."""
        self.held: asyncio.Future[None] | None = None
        self.failed: BaseException | None = None
        self.task: asyncio.Task[Any] | None = None

    async def run(self, events: AsyncIterator[Any], queue: Queue) -> None:
        """Consume `events` to their end (module docstring); every batch settled after.
        A held batch that fails to stage fails the agent (faust then stops the worker)."""
        self.task = asyncio.current_task()
        try:
            await self._consume(events, queue)
        except asyncio.CancelledError:
            if self.failed is not None:
                raise self.failed from None
            raise
        await self.drain()

    async def _consume(self, events: AsyncIterator[Any], queue: Queue) -> None:
        waited = False
        clock = asyncio.get_running_loop().time
        async for event in events:
            self.last = clock()
            self.pending.append(event)
            if len(self.pending) < self.most and not queue.empty():
                self._arm()
                continue
            if not waited and len(self.pending) < self.most and self.gather_s > 0:
                waited = True  # once per batch: let a trickle gather (bounded latency)
                self._disarm()  # the agent is not waiting on the stream meanwhile
                await asyncio.sleep(self.gather_s)
                self.last = clock()
                if not queue.empty():
                    self._arm()
                    continue
            waited = False
            self._disarm()
            await self.flush()
        self._disarm()
        await self.flush()

    async def flush(self) -> None:
        """Stage what is pending as one batch (in order with every other batch)."""
        if self.failed is not None:
            raise self.failed
        async with self.lock:
            if not self.pending:
                return
            events, self.pending = self.pending, []
            batch = await self.d.stage(events)
            before = self.d.inflight[-1] if self.d.inflight else None
            self.d.inflight.append(asyncio.ensure_future(self._settle(batch, events, before)))
            while self.d.inflight and (
                len(self.d.inflight) > self.depth or self.d.inflight[0].done()
            ):
                await self.d.inflight.popleft()

    async def drain(self) -> None:
        if self.held is not None:
            await asyncio.gather(self.held, return_exceptions=True)
        while self.d.inflight:
            await self.d.inflight.popleft()

    async def _settle(self, batch: Any, events: list[Any], before: Any | None) -> None:
        if before is not None:
            await before  # batches settle in order (a failed one fails those after it)
        await self.d.settle(batch)
        for event in events:
            await self.acks.ack(event)

    def _arm(self) -> None:
        """The agent is about to wait for a next event while holding a batch. One timer
        per held batch, not one per event: when it fires while events still come, it
        re-arms itself for `hold_s` after the latest one."""
        if self.timer is None:
            self.timer = asyncio.get_running_loop().call_at(self.last + self.hold_s, self._on_hold)

    def _disarm(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _on_hold(self) -> None:
        self.timer = None
        if not self.pending:
            return  # staged meanwhile
        loop = asyncio.get_running_loop()
        if loop.time() < self.last + self.hold_s:  # the agent took an event since
            self.timer = loop.call_at(self.last + self.hold_s, self._on_hold)
            return
        self.held = asyncio.ensure_future(self._flush_held())

    async def _flush_held(self) -> None:
        try:
            await self.flush()
        except BaseException as exc:  # the agent re-raises it on its next batch
            log.exception("staging a held batch failed")
            self.failed = exc
            if self.task is not None:
                self.task.cancel()
