"""request_id + attempt already answered, remembered in Redis after each commit.

Fails open: when Redis is unreachable the worker goes on (the offset-ordered transactions
still keep results exactly-once across crashes); only duplicates published upstream could
then be answered twice, and readers dedup by request_id + attempt anyway.
"""

from __future__ import annotations

import logging
from typing import Any

from schemas.sandbox import SandboxRequest

log = logging.getLogger("rollstream.sandbox.worker")


class Dedup:
    """request_id+attempt already answered (Redis; fails open: Kafka ordering still holds)."""

    def __init__(self, url: str | None, prefix: str, ttl_s: float) -> None:
        self._redis: Any = None
        if url:
            import redis.asyncio as aioredis

            self._redis = aioredis.Redis.from_url(url)
        self.prefix, self.ttl = f"rollstream:{prefix}:sandbox:done:", int(ttl_s)

    def key(self, request: SandboxRequest) -> str:
        return f"{self.prefix}{request.request_id}:{request.attempt}"

    async def seen(self, key: str) -> bool:
        if self._redis is None:
            return False
        try:
            return bool(await self._redis.exists(key))
        except Exception as exc:
            log.warning("dedup lookup failed (continuing): %s", exc)
            return False

    async def remember(self, keys: list[str]) -> None:
        if self._redis is None or not keys:
            return
        try:
            async with self._redis.pipeline(transaction=False) as pipe:
                for k in keys:
                    pipe.set(k, b"1", ex=self.ttl)
                await pipe.execute()
        except Exception as exc:
            log.warning("dedup record failed (continuing): %s", exc)

    async def close(self) -> None:
        if self._redis is not None:
            await self._redis.aclose()
