"""The envelope every message carries (DESIGN.md section 2).

`schema` is the struct's tag (its name); `v` its version; `id` a time-ordered UUIDv7
that is also the idempotency key; `origin` live | replay | production; `parent_id`
the lineage of replays and re-scoring.
"""

from __future__ import annotations

import enum
import os
import time
import uuid

import msgspec


class Origin(enum.StrEnum):
    """Where a message's data came from."""

    LIVE = "live"
    REPLAY = "replay"
    PRODUCTION = "production"


def new_id() -> str:
    """A UUIDv7 (RFC 9562): 48-bit millisecond timestamp, then random bits; sorts by time."""
    ms = time.time_ns() // 1_000_000
    rand = int.from_bytes(os.urandom(10), "big")
    value = (ms & ((1 << 48) - 1)) << 80 | rand & ((1 << 80) - 1)
    value = value & ~(0xF << 76) | (0x7 << 76)  # version 7
    value = value & ~(0x3 << 62) | (0x2 << 62)  # RFC 4122 variant
    return str(uuid.UUID(int=value))


def now() -> float:
    return time.time()


class Message(msgspec.Struct, kw_only=True, tag_field="schema", tag=True):
    """Base of every wire message. Subclasses set `v` and document each field as
    `writer -> reader`. Unknown fields are ignored on decode (forward compatibility)."""

    v: int = 1
    """Schema version. writer: every producer; reader: codec (upgrades older versions)."""
    id: str = msgspec.field(default_factory=new_id)
    """UUIDv7, the idempotency key. writer: every producer; reader: every consumer (dedup)."""
    created_at: float = msgspec.field(default_factory=now)
    """Unix seconds at creation. writer: every producer; reader: latency metrics, replay."""
    origin: Origin = Origin.LIVE
    """live | replay | production. writer: generator, replay, ingest; reader: learner."""
    parent_id: str | None = None
    """Id of the message this one derives from. writer: replay, dispatcher; reader: audit."""
