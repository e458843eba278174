"""The run's claim check, built from settings (schemas/ cannot import services.settings)."""

from __future__ import annotations

from schemas.claimcheck import BlobStore, ClaimCheck, DirBlobStore, RedisBlobStore
from services.settings import Settings


def store_from_settings(settings: Settings) -> BlobStore:
    """The blob store that `blobs.backend` names."""
    blobs = settings.blobs
    if blobs.backend == "dir":
        return DirBlobStore(blobs.dir or settings.stack.state_dir / "blobs", ttl_s=blobs.ttl_s)
    return RedisBlobStore(settings.redis.endpoint, prefix=blobs.redis_prefix)


def from_settings(settings: Settings) -> ClaimCheck:
    """A ClaimCheck with the configured store, inline limit and TTL. Close it with
    ``await claim_check.aclose()``."""
    blobs = settings.blobs
    return ClaimCheck(
        store_from_settings(settings), inline_limit=blobs.inline_limit_bytes, ttl_s=blobs.ttl_s
    )
