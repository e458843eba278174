"""The generator's task intake: sampling out of the consumer's poll loop.

The poll loop only polls: it takes one task from `tasks`, pauses the assigned partitions
and hands the task to a worker task (pacing, sampling, publication, then the commit of
the task's offset, in `handle`). While the worker runs, the loop keeps polling the paused
consumer, so the member stays alive however long an episode takes (no max.poll.interval
expiry, no reassignment, no second sampling of the same task). On a rebalance, a worker
still waiting for pacing is cancelled (its task is not committed: the next owner samples
it, nothing was sampled here); one already sampling is awaited, so its group is published
and committed before the partitions move.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from aiokafka import AIOKafkaConsumer

    from services.kafka import KafkaRecord

log = logging.getLogger("rollstream.generator.intake")
Handle = Callable[["KafkaRecord"], Coroutine[Any, Any, None]]


class Intake:
    def __init__(self, consumer: AIOKafkaConsumer, handle: Handle) -> None:
        self.consumer, self.handle = consumer, handle
        self.worker: asyncio.Task[None] | None = None
        self.sampling = False
        """Set by `handle` once past pacing: from then on the worker is awaited, never
        cancelled (its group is being sampled)."""

    @property
    def busy(self) -> bool:
        return self.worker is not None and not self.worker.done()

    async def poll(self, timeout_ms: int = 500) -> bool:
        """One poll. Idle: fetch at most one task and start its worker (True when one
        started). Busy: a poll of the paused consumer that keeps the member alive."""
        self._reap()
        if self.worker is not None and self.busy:
            await asyncio.wait({self.worker}, timeout=timeout_ms / 1000)
            await self.consumer.getmany(timeout_ms=0, max_records=1)  # paused: liveness only
            return False
        self.consumer.resume(*self.consumer.assignment())
        batches = await self.consumer.getmany(timeout_ms=timeout_ms, max_records=1)
        records = [r for rs in batches.values() for r in rs]
        if not records:
            return False
        self.consumer.pause(*self.consumer.assignment())
        self.sampling = False
        self.worker = asyncio.create_task(self.handle(records[0]), name="generator-worker")
        return True

    def _reap(self) -> None:
        if self.worker is not None and self.worker.done():
            worker, self.worker = self.worker, None
            if not worker.cancelled() and worker.exception() is not None:
                raise worker.exception()  # type: ignore[misc]

    async def drain(self) -> None:
        """Stop: a worker still pacing is cancelled, one sampling is awaited."""
        if self.worker is None:
            return
        if not self.sampling:
            self.worker.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.worker
        self._reap()

    def listener(self) -> Any:
        """The rebalance listener that drains the worker before partitions move."""
        from aiokafka import ConsumerRebalanceListener

        intake = self

        class Listener(ConsumerRebalanceListener):  # type: ignore[misc]
            async def on_partitions_revoked(self, revoked: Any) -> None:
                if intake.busy:
                    log.info("rebalance: finishing the group in flight first")
                    await intake.drain()

            async def on_partitions_assigned(self, assigned: Any) -> None:
                return None

        return Listener()
