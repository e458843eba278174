"""Claim check: messages over the inline limit travel as a BlobRef (DESIGN.md section 2).

``ClaimCheck.pack(msg)`` encodes the message; if the bytes exceed the inline limit they go
to a blob store under a key derived from their SHA-256 (content-addressed, so a retried
put is harmless) and the Kafka record carries an encoded BlobRef instead.
``ClaimCheck.unpack(data)`` reverses it: an inline message is decoded as usual; a BlobRef
is resolved, its size and SHA-256 verified, and the inner message decoded.

Errors: anything wrong with the data (undecodable, missing or expired blob, size or hash
mismatch, wrong inner type) raises SchemaError, so the consumer dead-letters it. Failures
of the store itself (Redis down, disk error) propagate unchanged, so the consumer retries
instead of dead-lettering good data.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import re
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Final, Protocol, TypeVar, overload

from schemas.codec import MAX_MESSAGE_BYTES, SchemaError, decode, encode, schema_name
from schemas.envelope import Message
from schemas.transport import BlobRef

if TYPE_CHECKING:
    from redis.asyncio import Redis

T = TypeVar("T", bound=Message)

DEFAULT_INLINE_LIMIT: Final = 256 * 1024
"""Encoded messages up to this size travel inline (settings: blobs.inline_limit_bytes)."""
_KEY_RE: Final = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,199}$")


class BlobStore(Protocol):
    """Where claim-checked payloads live. ``kind`` is recorded in each BlobRef."""

    kind: str

    async def put(self, key: str, data: bytes, ttl_s: float | None) -> None:
        """Store `data` under `key`, replacing any previous value. Expire it after ttl_s
        seconds (None: never); a store may apply its own policy instead (DirBlobStore
        expires by age with the store's TTL)."""

    async def get(self, key: str) -> bytes | None:
        """The bytes under `key`, or None when absent or expired."""

    async def aclose(self) -> None:
        """Release connections."""


def _check_key(key: str) -> str:
    if not _KEY_RE.match(key):
        raise ValueError(f"invalid blob key {key!r}: want [A-Za-z0-9._:-], at most 200 chars")
    return key


class RedisBlobStore:
    """Blobs as Redis strings with a TTL. ``redis`` is imported on construction only."""

    kind = "redis"

    def __init__(
        self, url: str = "redis://127.0.0.1:6379/0", *, prefix: str = "rollstream:blob:"
    ) -> None:
        from redis.asyncio import Redis

        self.prefix = prefix
        self.client: Redis = Redis.from_url(url)

    async def put(self, key: str, data: bytes, ttl_s: float | None) -> None:
        expire = None if ttl_s is None else max(1, round(ttl_s))
        await self.client.set(self.prefix + _check_key(key), data, ex=expire)

    async def get(self, key: str) -> bytes | None:
        value = await self.client.get(self.prefix + _check_key(key))
        return value if isinstance(value, bytes) or value is None else value.encode()

    async def aclose(self) -> None:
        await self.client.aclose()


class DirBlobStore:
    """Blobs as files under `root` (a local disk or a shared mount). Writes are atomic: a
    temporary file in the same directory, fsync, rename, fsync of the directory.

    Expiry is by age and per store: a blob older than `ttl_s` (from its last write) reads
    as absent, and ``sweep`` deletes it. The per-put ttl is not stored per file; give the
    store the same TTL the claim check uses (services/blobs.py does). None: blobs never
    expire here (an object store's lifecycle rule may do it instead)."""

    kind = "dir"

    def __init__(self, root: str | os.PathLike[str], ttl_s: float | None = None) -> None:
        self.root = Path(root)
        self.ttl_s = ttl_s

    def path(self, key: str) -> Path:
        key = _check_key(key)
        return self.root / key[:2] / key

    async def put(self, key: str, data: bytes, ttl_s: float | None) -> None:
        await asyncio.to_thread(_write_atomic, self.path(key), data)

    async def get(self, key: str) -> bytes | None:
        return await asyncio.to_thread(self._get, self.path(key))

    async def sweep(self) -> int:
        """Delete expired blobs and abandoned temporary files; returns how many."""
        return await asyncio.to_thread(self._sweep)

    async def aclose(self) -> None:
        return None

    def _expired(self, mtime: float, now: float) -> bool:
        return self.ttl_s is not None and mtime + self.ttl_s < now

    def _get(self, path: Path) -> bytes | None:
        try:
            if self._expired(path.stat().st_mtime, time.time()):
                return None
            return path.read_bytes()
        except FileNotFoundError:
            return None

    def _sweep(self) -> int:
        now, removed = time.time(), 0
        for path in self.root.glob("*/*"):
            mtime = path.stat().st_mtime
            stale_tmp = path.name.startswith(_TMP) and mtime + _TMP_MAX_AGE_S < now
            if stale_tmp or (not path.name.startswith(_TMP) and self._expired(mtime, now)):
                path.unlink(missing_ok=True)
                removed += 1
        return removed


_TMP: Final = ".tmp-"
_TMP_MAX_AGE_S: Final = 3600.0


def _write_atomic(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=_TMP)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


class ClaimCheck:
    """Pack messages for Kafka, moving large ones to `store` (see module docstring)."""

    def __init__(
        self,
        store: BlobStore,
        inline_limit: int = DEFAULT_INLINE_LIMIT,
        ttl_s: float | None = 7 * 24 * 3600.0,
    ) -> None:
        if inline_limit < 1024:
            raise ValueError(f"inline_limit {inline_limit} is below 1024 bytes")
        self.store = store
        self.inline_limit = inline_limit
        self.ttl_s = ttl_s

    async def pack(self, msg: Message, inline_limit: int | None = None) -> bytes:
        """Bytes for a Kafka record value: the message itself, or a BlobRef to it (when
        over `inline_limit`, by default the claim check's; 0: always a BlobRef)."""
        data = encode(msg)
        if len(data) <= (self.inline_limit if inline_limit is None else inline_limit):
            return data
        digest = hashlib.sha256(data).hexdigest()
        await self.store.put(digest, data, self.ttl_s)
        ref = BlobRef(
            id=msg.id,
            created_at=msg.created_at,
            origin=msg.origin,
            parent_id=msg.parent_id,
            sha256=digest,
            size=len(data),
            store=self.store.kind,
            key=digest,
            inner_schema=schema_name(type(msg)),
        )
        return encode(ref)

    @overload
    async def unpack(self, data: bytes, expected: None = None) -> Message: ...
    @overload
    async def unpack(self, data: bytes, expected: type[T]) -> T: ...

    async def unpack(self, data: bytes, expected: type[Message] | None = None) -> Message:
        """The message a record value stands for, fetched and verified if claim-checked."""
        msg = decode(data)
        if isinstance(msg, BlobRef) and expected is not BlobRef:
            msg = await self.resolve(msg, expected)
        if expected is not None and not isinstance(msg, expected):
            why = f"expected {schema_name(expected)}, got {schema_name(type(msg))}"
            raise SchemaError(schema_name(expected), "$.schema", why)
        return msg

    async def resolve(self, ref: BlobRef, expected: type[Message] | None = None) -> Message:
        """Fetch, verify and decode the message a BlobRef stands for."""
        what = ref.inner_schema
        if expected is not None and what != schema_name(expected):
            why = f"expected {schema_name(expected)}, the reference holds {what}"
            raise SchemaError(schema_name(expected), "$.inner_schema", why)
        if ref.store != self.store.kind:
            why = f"blob is in a {ref.store!r} store; this reader uses {self.store.kind!r}"
            raise SchemaError(what, f"blob {ref.key}", why)
        if not _KEY_RE.match(ref.key):
            raise SchemaError(what, "$.key", f"invalid blob key {ref.key[:80]!r}")
        if ref.size > MAX_MESSAGE_BYTES:
            why = f"size {ref.size} exceeds the codec cap of {MAX_MESSAGE_BYTES}"
            raise SchemaError(what, "$.size", why)
        blob = _verified(ref, await self.store.get(ref.key))
        inner = decode(blob, expected)
        if isinstance(inner, BlobRef) or inner.id != ref.id:
            why = f"blob holds {schema_name(type(inner))} {inner.id}, not {what} {ref.id}"
            raise SchemaError(what, f"blob {ref.key}", why)
        return inner

    async def aclose(self) -> None:
        await self.store.aclose()


def _verified(ref: BlobRef, blob: bytes | None) -> bytes:
    where = f"blob {ref.key}"
    if blob is None:
        raise SchemaError(ref.inner_schema, where, "missing (expired or never stored)")
    if len(blob) != ref.size:
        why = f"size {len(blob)} differs from the reference's {ref.size} (tampered or corrupt)"
        raise SchemaError(ref.inner_schema, where, why)
    digest = hashlib.sha256(blob).hexdigest()
    if digest != ref.sha256:
        why = f"sha256 {digest[:16]}... differs from the reference's (tampered or corrupt)"
        raise SchemaError(ref.inner_schema, where, why)
    return blob
