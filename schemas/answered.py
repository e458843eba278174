"""The offset-commit metadata of the sandbox workers' group: which records at or past the
committed offset are answered already (pure; no Kafka client here).

A sandbox worker publishes a result as soon as its job ends, not in offset order, so a
partition's committed offset (the next record to consume) can stay behind results already
published. The records past it that are answered travel in the same transaction, as the
commit's metadata string:

- `""`: none (what every other consumer group commits);
- `"done1:" + base64url(bitmap)`, padding included: bit i (least significant bit first
  within byte i // 8) set when the record at committed offset + i is answered.

Writer: the sandbox worker (sandbox_workers/outbox.py), with the results in one Kafka
transaction, so results and metadata commit together. Readers: the worker that takes the
partition over (it answers nothing twice), the feeder's sandbox backlog and
`rollstream status` (they count the answered records as taken). Kafka keeps metadata of
at most `offset.metadata.max.bytes` (4096 by default): a worker answers ahead of the
committed offset by less than `MAX_SPAN` offsets, 2,738 characters at most.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Iterable

PREFIX = "done1:"
MAX_SPAN = 16384
"""Offsets past the committed one that metadata may mark answered."""


def encode(committed: int, answered: Iterable[int]) -> str:
    """Metadata for a commit at `committed` marking `answered` (offsets below it are
    left out: the commit covers them). Raises ValueError past MAX_SPAN."""
    rel = sorted({o - committed for o in answered if o >= committed})
    if not rel:
        return ""
    if rel[-1] >= MAX_SPAN:
        raise ValueError(f"answered offset {committed + rel[-1]} is {rel[-1]} past the commit")
    bits = bytearray(rel[-1] // 8 + 1)
    for r in rel:
        bits[r // 8] |= 1 << (r % 8)
    return PREFIX + base64.urlsafe_b64encode(bytes(bits)).decode()


def decode(committed: int, metadata: str) -> set[int]:
    """The answered offsets a commit's metadata marks. Raises ValueError when the metadata
    is not this format (the empty string is: nothing answered)."""
    if not metadata:
        return set()
    if not metadata.startswith(PREFIX):
        raise ValueError(f"not answered-offsets metadata: {metadata[:40]!r}")
    try:
        bits = base64.b64decode(metadata[len(PREFIX) :].encode("ascii"), b"-_", validate=True)
    except (binascii.Error, UnicodeEncodeError) as exc:
        raise ValueError(f"bad answered-offsets metadata: {exc}") from exc
    if len(bits) * 8 > MAX_SPAN:
        raise ValueError(f"answered-offsets metadata spans {len(bits) * 8} offsets")
    return {committed + 8 * i + b for i, byte in enumerate(bits) for b in range(8) if byte >> b & 1}


def count(metadata: str) -> int:
    """How many records the metadata marks answered (0 for any other metadata)."""
    try:
        return len(decode(0, metadata))
    except ValueError:
        return 0
