"""Run one job through the sandbox tier over Kafka and wait for its result: the
generators' multi-turn episodes and the feeder's reference checks use it.

Requests go to `sandbox.requests` (key request_id); results are read from every partition
of `sandbox.results` (read_committed, from the end at start) and matched by request_id
and attempt. The dispatcher reads the same results; it ignores those of groups it does
not know, so the two never interfere.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING, Any

from schemas import codec, topics
from schemas.codec import SchemaError
from schemas.sandbox import SandboxRequest, SandboxResult
from services.rollout import kafkaio

if TYPE_CHECKING:
    from schemas.claimcheck import ClaimCheck
    from services.settings import Settings

log = logging.getLogger("rollstream.sandbox_client")


class SandboxClient:
    def __init__(self, settings: Settings, producer: Any, claim: ClaimCheck, name: str) -> None:
        self.settings = settings
        self.producer = producer
        self.claim = claim
        self.name = name
        self.waiting: dict[tuple[str, int], asyncio.Future[SandboxResult]] = {}
        self._consumer: Any = None
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._consumer = kafkaio.reader(self.settings, f"rollstream-{self.name}-results")
        await self._consumer.start()
        results = kafkaio.topic(self.settings, topics.SANDBOX_RESULTS)
        await kafkaio.assign_all(self.settings, self._consumer, [results], at="end")
        self._task = asyncio.create_task(self._read(), name=f"{self.name}-results")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._consumer is not None:
            await self._consumer.stop()
        for fut in self.waiting.values():
            fut.cancel()

    async def run(self, request: SandboxRequest, timeout_s: float) -> SandboxResult | None:
        """The job's result, or None when none came within `timeout_s`."""
        key = (request.request_id, request.attempt)
        fut: asyncio.Future[SandboxResult] = asyncio.get_running_loop().create_future()
        self.waiting[key] = fut
        try:
            await self.producer.send_and_wait(
                kafkaio.topic(self.settings, topics.SANDBOX_REQUESTS),
                value=codec.encode(request),
                key=request.request_id.encode(),
            )
            return await asyncio.wait_for(fut, timeout_s)
        except TimeoutError:
            return None
        finally:
            self.waiting.pop(key, None)

    async def _read(self) -> None:
        while True:
            try:
                batches = await self._consumer.getmany(timeout_ms=500)
                for records in batches.values():
                    for rec in records:
                        await self._deliver(rec)
            except Exception:  # waiting requests time out on their own
                log.exception("reading sandbox results failed; retrying")
                await asyncio.sleep(1.0)

    async def _deliver(self, rec: Any) -> None:
        if not self.waiting or rec.value is None:
            return
        try:
            result = await self.claim.unpack(rec.value, SandboxResult)
        except SchemaError:
            return  # not ours to dead-letter: the dispatcher reads this topic too
        fut = self.waiting.get((result.request_id, result.attempt))
        if fut is not None and not fut.done():
            fut.set_result(result)
