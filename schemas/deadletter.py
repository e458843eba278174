"""Dead letters: the one way every consumer hands over input it cannot use.

Bad input never crashes a consumer and is never silently dropped (DESIGN.md section 2)::

    try:
        traj = await claim_check.unpack(record.value, Trajectory)
    except SchemaError as exc:
        await publish_dead_letter(
            producer, topics.DLQ.full_name(prefix), reason=f"undecodable: {exc}",
            source_topic=record.topic, partition=record.partition, offset=record.offset,
            key=record.key, value=record.value, consumer="dispatcher-0", error=exc,
        )
        # then commit the offset and move on

The DLQ record's key is the source record's key. If publishing fails the exception
propagates: the consumer must not commit the source offset then (it will see the record
again, which is the at-least-once promise).
"""

from __future__ import annotations

import hashlib
import logging
from typing import TYPE_CHECKING, Final, Protocol

from schemas.codec import encode
from schemas.transport import DeadLetter

if TYPE_CHECKING:
    from schemas.claimcheck import ClaimCheck

log = logging.getLogger("rollstream.dlq")

MAX_ORIGINAL_BYTES: Final = 768 * 1024
"""Without a claim check, originals beyond this are cut (Kafka's default record limit is
1 MiB); the DeadLetter keeps the whole value's size and SHA-256."""
MAX_DETAIL_CHARS: Final = 4000


class Producer(Protocol):
    """What publish_dead_letter needs from a Kafka producer (aiokafka's AIOKafkaProducer
    fits; so does a test double)."""

    async def send_and_wait(
        self, topic: str, value: bytes | None = None, key: bytes | None = None
    ) -> object: ...


async def publish_dead_letter(
    producer: Producer,
    dlq_topic: str,
    *,
    reason: str,
    source_topic: str,
    partition: int,
    offset: int,
    key: bytes | None,
    value: bytes | None,
    consumer: str,
    error: BaseException | None = None,
    claim_check: ClaimCheck | None = None,
    max_original_bytes: int = MAX_ORIGINAL_BYTES,
) -> DeadLetter:
    """Publish a DeadLetter for one source record and return it.

    `reason` says what was wrong in words a person can act on; `error` (optional) adds the
    exception's type and message. With a `claim_check` the original travels whole (a large
    DeadLetter goes to the blob store); without one, originals over `max_original_bytes`
    are truncated and flagged.
    """
    if not reason.strip():
        raise ValueError("a dead letter needs a reason a person can act on")
    letter = _letter(
        reason=reason,
        source_topic=source_topic,
        partition=partition,
        offset=offset,
        key=key,
        value=value if value is not None else b"",
        consumer=consumer,
        error=error,
        cap=None if claim_check is not None else max_original_bytes,
    )
    data = await claim_check.pack(letter) if claim_check is not None else encode(letter)
    await producer.send_and_wait(dlq_topic, value=data, key=key)
    log.warning(
        "dead letter: %s[%d]@%d -> %s by %s: %s",
        source_topic,
        partition,
        offset,
        dlq_topic,
        consumer,
        reason,
    )
    return letter


def _letter(
    *,
    reason: str,
    source_topic: str,
    partition: int,
    offset: int,
    key: bytes | None,
    value: bytes,
    consumer: str,
    error: BaseException | None,
    cap: int | None,
) -> DeadLetter:
    truncated = cap is not None and len(value) > cap
    detail = "" if error is None else str(error)
    if len(detail) > MAX_DETAIL_CHARS:
        detail = detail[:MAX_DETAIL_CHARS] + "..."
    return DeadLetter(
        reason=reason,
        error_type="" if error is None else type(error).__name__,
        detail=detail,
        source_topic=source_topic,
        source_partition=partition,
        source_offset=offset,
        source_key=key,
        original=value[:cap] if truncated else value,
        original_size=len(value),
        original_sha256=hashlib.sha256(value).hexdigest(),
        truncated=truncated,
        consumer=consumer,
    )
