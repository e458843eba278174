"""Messages of the transport itself: claim-check references and dead letters
(DESIGN.md section 2)."""

from __future__ import annotations

from typing import Annotated

import msgspec

from schemas.envelope import Message
from schemas.fields import Count, Key, Sha256Hex


class BlobRef(Message, kw_only=True):
    """Stands in for a message too large to travel inline (claim check). It is published
    on the inner message's topic, under the inner message's key, and carries the inner
    message's envelope (id, created_at, origin, parent_id), so dedup and lineage work
    without fetching the blob. Readers fetch the blob, verify sha256 and size, decode it."""

    sha256: Sha256Hex
    """SHA-256 of the encoded inner message. writer: claim check; reader: claim check
    (verification)."""
    size: Count
    """Length of the encoded inner message. writer: claim check; reader: claim check."""
    store: Key
    """Kind of blob store holding it (redis | dir). writer: claim check; reader: claim
    check (refuses a reference into a store it does not use)."""
    key: Key
    """Key of the blob in that store (content-addressed: derived from sha256). writer:
    claim check; reader: claim check."""
    inner_schema: Key
    """Schema name of the inner message (Trajectory ...). writer: claim check; reader:
    claim check (type check before fetching), operators."""


class DeadLetter(Message, kw_only=True):
    """Input a consumer could not handle, with a reason a person can act on. Topic `dlq`,
    key = the source record's key. Written by schemas.deadletter.publish_dead_letter."""

    reason: Annotated[str, msgspec.Meta(min_length=1)]
    """What was wrong, for a person (undecodable: Trajectory at $.group_size: ...).
    writer: every consumer; reader: operators."""
    error_type: str = ""
    """Exception class that rejected it (SchemaError ...), empty if none. writer: every
    consumer; reader: operators (grouping)."""
    detail: str = ""
    """The exception's message, truncated. writer: every consumer; reader: operators."""
    source_topic: str
    """Topic the record came from. writer: every consumer; reader: operators, replay."""
    source_partition: Annotated[int, msgspec.Meta(ge=-1)] = -1
    """Its partition (-1 if unknown). writer: every consumer; reader: operators, replay."""
    source_offset: Annotated[int, msgspec.Meta(ge=-1)] = -1
    """Its offset (-1 if unknown). writer: every consumer; reader: operators, replay."""
    source_key: bytes | None = None
    """Its Kafka key, unchanged (also the key of the DLQ record). writer: every consumer;
    reader: operators, replay."""
    original: bytes
    """The record's value, unchanged (or its first bytes, see truncated). writer: every
    consumer; reader: operators, replay (republish after a fix)."""
    original_size: Count = 0
    """Length of the whole original value. writer: every consumer; reader: operators."""
    original_sha256: str = ""
    """SHA-256 of the whole original value (hex). writer: every consumer; reader: replay
    (identity check)."""
    truncated: bool = False
    """True when `original` holds only the first bytes (value over the DLQ size cap and no
    claim check given). writer: every consumer; reader: operators."""
    consumer: Key
    """Consumer (group and process) that gave up on it. writer: every consumer; reader:
    operators."""
