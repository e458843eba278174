"""Publishing from the gateway: an idempotent Kafka producer (acks=all) with the claim
check, behind a small protocol so the HTTP layer can be tested with an in-memory double."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, Protocol

from schemas import topics
from schemas.envelope import Message

if TYPE_CHECKING:
    from services.settings import Settings


class Publisher(Protocol):
    async def publish(self, items: list[tuple[topics.TopicSpec, str, Message]]) -> None:
        """Publish (topic, key, message) items of the run; return when all are acked."""
        ...

    def healthy(self) -> bool: ...


class KafkaPublisher:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.prefix = settings.topics.prefix
        self.producer: Any = None
        self.claim: Any = None

    async def start(self) -> None:
        from services import blobs, kafka

        self.claim = blobs.from_settings(self.settings)
        self.producer = kafka.producer(self.settings, "rollstream-ingest")
        await self.producer.start()

    async def stop(self) -> None:
        if self.producer is not None:
            await self.producer.stop()
        if self.claim is not None:
            await self.claim.aclose()

    def healthy(self) -> bool:
        client = getattr(self.producer, "client", None)
        return client is not None and bool(client.cluster.brokers())

    async def publish(self, items: list[tuple[topics.TopicSpec, str, Message]]) -> None:
        futures = []
        for spec, key, msg in items:
            value = await self.claim.pack(msg)
            topic = spec.full_name(self.prefix)
            futures.append(await self.producer.send(topic, value=value, key=key.encode()))
        await asyncio.gather(*futures)
