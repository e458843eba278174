"""Run one job through the sandbox tier over Kafka and wait for its result: the
generators' multi-turn episodes and the feeder's reference checks use it.

Requests go to `sandbox.requests` (key request_id); results are read from every partition
of `sandbox.results` (read_committed, from the end at start) and matched by request_id
and attempt. The dispatcher reads the same results; it ignores those of groups it does
not know, so the two never interfere.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from schemas import codec, topics
from schemas.codec import SchemaError
from schemas.sandbox import SandboxRequest, SandboxResult
from services import kafka

if TYPE_CHECKING:
    from aiokafka import AIOKafkaProducer

    from schemas.claimcheck import ClaimCheck
    from services.settings import Settings

log = logging.getLogger("rollstream.sandbox_client")


class SandboxClient:
    def __init__(
        self, settings: Settings, producer: AIOKafkaProducer, claim: ClaimCheck, name: str
    ) -> None:
        self.settings = settings
        self.producer = producer
        self.claim = claim
        self.name = name
        self.waiting: dict[tuple[str, int], asyncio.Future[SandboxResult]] = {}
        results = [kafka.topic(settings, topics.SANDBOX_RESULTS)]
        self._follower = kafka.Follower(settings, f"rollstream-{name}-results", results, "end")

    async def start(self) -> None:
        await self._follower.start(self._batch)

    async def stop(self) -> None:
        await self._follower.stop()
        for fut in self.waiting.values():
            fut.cancel()

    async def run(self, request: SandboxRequest, timeout_s: float) -> SandboxResult | None:
        """The job's result, or None when none came within `timeout_s`."""
        key = (request.request_id, request.attempt)
        fut: asyncio.Future[SandboxResult] = asyncio.get_running_loop().create_future()
        self.waiting[key] = fut
        try:
            await self.producer.send_and_wait(
                kafka.topic(self.settings, topics.SANDBOX_REQUESTS),
                value=codec.encode(request),
                key=request.request_id.encode(),
            )
            return await asyncio.wait_for(fut, timeout_s)
        except TimeoutError:
            return None
        finally:
            self.waiting.pop(key, None)

    async def _batch(self, records: list[kafka.KafkaRecord]) -> None:
        for rec in records:  # on trouble, waiting requests time out on their own
            await self._deliver(rec)

    async def _deliver(self, rec: kafka.KafkaRecord) -> None:
        if not self.waiting or rec.value is None:
            return
        try:
            result = await self.claim.unpack(rec.value, SandboxResult)
        except SchemaError:
            return  # not ours to dead-letter: the dispatcher reads this topic too
        fut = self.waiting.get((result.request_id, result.attempt))
        if fut is not None and not fut.done():
            fut.set_result(result)
