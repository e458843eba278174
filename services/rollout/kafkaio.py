"""Kafka plumbing shared by the feeder, the generators and the demo: clients built from
settings, topic names, counts from end offsets, and dead letters."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal

from schemas import topics
from schemas.deadletter import publish_dead_letter
from services import kafka

if TYPE_CHECKING:
    from services.settings import Settings

log = logging.getLogger(__name__)


def topic(settings: Settings, spec: topics.TopicSpec) -> str:
    return spec.full_name(settings.topics.prefix)


def producer(settings: Settings, client_id: str) -> Any:
    """An idempotent producer with acks=all (DESIGN.md section 3). Not started."""
    from aiokafka import AIOKafkaProducer

    logging.getLogger("aiokafka").setLevel(logging.WARNING)
    return AIOKafkaProducer(
        bootstrap_servers=settings.kafka.endpoint,
        client_id=client_id,
        acks="all",
        enable_idempotence=True,
        linger_ms=5,
        max_request_size=8 * 1024 * 1024,
    )


def reader(settings: Settings, client_id: str, **kwargs: Any) -> Any:
    """A group-less consumer (partitions are assigned by hand), read_committed. Not started."""
    from aiokafka import AIOKafkaConsumer

    logging.getLogger("aiokafka").setLevel(logging.WARNING)
    return AIOKafkaConsumer(
        bootstrap_servers=settings.kafka.endpoint,
        client_id=client_id,
        enable_auto_commit=False,
        isolation_level="read_committed",
        auto_offset_reset="earliest",
        **kwargs,
    )


async def assign_all(
    settings: Settings,
    consumer: Any,
    names: list[str],
    at: Literal["beginning", "end"] = "beginning",
) -> list[Any]:
    """Assign every partition of the topics, positioned at their beginning or end."""
    return await kafka.assign_all(settings, consumer, names, at)


async def record_count(settings: Settings, consumer: Any, name: str) -> int:
    """Records ever written to a topic (sum of its partitions' end offsets). Exact for
    topics written without transactions (trajectories, tasks)."""
    return await kafka.record_count(settings, consumer, name)


class DeadLetters:
    """Dead letters of one consumer: log, count, publish (DESIGN.md section 2)."""

    def __init__(
        self,
        settings: Settings,
        producer: Any,
        consumer: str,
        on_send: Callable[[], object] | None = None,
    ) -> None:
        self.topic = topic(settings, topics.DLQ)
        self.producer = producer
        self.consumer = consumer
        self.on_send = on_send
        """Called per dead letter (a metrics counter)."""
        self.count = 0

    async def send(
        self, record: Any, reason: str, error: BaseException | None = None, *, source: str = ""
    ) -> None:
        """Dead-letter a Kafka record (or, with `source`, a line of a file: record is then
        (line number, text))."""
        self.count += 1
        if self.on_send is not None:
            self.on_send()
        if source:
            number, text = record
            where = {"source_topic": source, "partition": 0, "offset": number}
            key, value = None, text.encode()
        else:
            where = {
                "source_topic": record.topic,
                "partition": record.partition,
                "offset": record.offset,
            }
            key, value = record.key, record.value
        await publish_dead_letter(
            self.producer,
            self.topic,
            reason=reason,
            key=key,
            value=value,
            consumer=self.consumer,
            error=error,
            **where,
        )
