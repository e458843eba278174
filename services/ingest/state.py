"""The gateway's state in Redis: idempotency records and traces awaiting feedback.

Keys, under `rollstream:{prefix}:ingest:`:

- `req:{kind}:{client id}`: the first request with that id (JSON: the trajectory or
  feedback id it was given, a fingerprint of its body, whether its effect is done),
  created with SET NX, kept `idempotency_ttl_s`. A retry finds it: done, it is answered
  as before and publishes nothing; not done (the first one died half-way), the effect is
  redone under the same ids, which downstream consumers dedup.
- `tid:{trajectory id}`: the client id of a trace, so feedback may name either.
- `trace:{trajectory id}`: a trace awaiting feedback (its wire bytes), kept
  `feedback_window_s`; also in the sorted set `pending` (score: its deadline), which
  `rollstream status` counts.
- `joined:{trajectory id}`: the feedback id joined to the trace (SET NX: one per trace).
- `lock:{kind}:{client id}`: held (SET NX, `EFFECT_LOCK_S`) by the one request doing an
  id's effect; a concurrent request with the same id waits until the effect is done and
  answers as a duplicate, so concurrent requests with one id publish once.

Several gateway replicas may share one Redis; every claim is a single atomic command.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
from collections.abc import AsyncIterator
from typing import Any

from redis.asyncio import Redis

EFFECT_LOCK_S = 30
"""Longest time one request holds an id's effect lock (a request that died holding it
blocks that id's retries this long at most)."""
EFFECT_WAIT_S = 10.0
"""Longest time a request waits for a concurrent one doing the same id's effect (then 503:
retry later)."""
_UNLOCK = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end"


def namespace(prefix: str) -> str:
    return f"rollstream:{prefix}:ingest:"


class IngestState:
    def __init__(self, redis: Redis, prefix: str, idempotency_ttl_s: float, window_s: float):
        self.redis = redis
        self.ns = namespace(prefix)
        self.idem_ttl = max(1, round(idempotency_ttl_s))
        self.window = max(1, round(window_s))

    @classmethod
    def from_url(cls, url: str, prefix: str, idempotency_ttl_s: float, window_s: float):  # type: ignore[no-untyped-def]
        return cls(Redis.from_url(url), prefix, idempotency_ttl_s, window_s)

    async def aclose(self) -> None:
        await self.redis.aclose()

    async def ping(self) -> bool:
        try:
            return bool(await self.redis.ping())
        except Exception:
            return False

    # -- idempotency ------------------------------------------------------------------

    async def claim(self, kind: str, client_id: str, record: dict[str, Any]) -> dict[str, Any]:
        """Store `record` for a new client id and return it; for a known id return the
        record stored first (compare its fingerprint and `done`)."""
        key = f"{self.ns}req:{kind}:{client_id}"
        for _ in range(3):  # the record may expire between SET NX and GET: claim again
            if await self.redis.set(key, json.dumps(record), nx=True, ex=self.idem_ttl):
                if kind == "trace":
                    tid = record["trajectory_id"]
                    await self.redis.set(f"{self.ns}tid:{tid}", client_id, ex=self.idem_ttl)
                return record
            found = await self.record(kind, client_id)
            if found is not None:
                return found
        raise RuntimeError(f"cannot claim request id {client_id!r} in Redis")

    async def record(self, kind: str, client_id: str) -> dict[str, Any] | None:
        raw = await self.redis.get(f"{self.ns}req:{kind}:{client_id}")
        return None if raw is None else dict(json.loads(_text(raw)))

    async def done(self, kind: str, client_id: str, record: dict[str, Any]) -> None:
        """Mark a request's effect durable (its record keeps its expiry)."""
        record = {**record, "done": True}
        key = f"{self.ns}req:{kind}:{client_id}"
        await self.redis.set(key, json.dumps(record), xx=True, keepttl=True)

    @contextlib.asynccontextmanager
    async def effect(self, kind: str, client_id: str) -> AsyncIterator[dict[str, Any] | None]:
        """Hold the effect lock of a request id. Yields the id's record when another
        request finished the effect meanwhile (do nothing then), else None (do it, then
        `done`). TimeoutError when a concurrent request holds it past EFFECT_WAIT_S."""
        key, token = f"{self.ns}lock:{kind}:{client_id}", os.urandom(8).hex()
        deadline = time.monotonic() + EFFECT_WAIT_S
        while not await self.redis.set(key, token, nx=True, ex=EFFECT_LOCK_S):
            found = await self.record(kind, client_id)
            if found is not None and found.get("done"):
                yield found
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"request id {client_id!r} is being handled: retry later")
            await asyncio.sleep(0.05)
        try:
            found = await self.record(kind, client_id)
            yield found if found is not None and found.get("done") else None
        finally:
            await self.redis.eval(_UNLOCK, 1, key, token)

    async def client_of(self, trajectory_id: str) -> str | None:
        raw = await self.redis.get(f"{self.ns}tid:{trajectory_id}")
        return None if raw is None else _text(raw)

    # -- traces awaiting feedback ------------------------------------------------------

    async def hold(self, trajectory_id: str, data: bytes) -> None:
        now = time.time()
        pipe = self.redis.pipeline(transaction=True)
        pipe.set(f"{self.ns}trace:{trajectory_id}", data, ex=self.window)
        pipe.zadd(f"{self.ns}pending", {trajectory_id: now + self.window})
        pipe.zremrangebyscore(f"{self.ns}pending", "-inf", now - self.window)
        await pipe.execute()

    async def trace(self, trajectory_id: str) -> bytes | None:
        raw = await self.redis.get(f"{self.ns}trace:{trajectory_id}")
        return None if raw is None else raw if isinstance(raw, bytes) else raw.encode()

    async def release(self, trajectory_id: str) -> None:
        pipe = self.redis.pipeline(transaction=True)
        pipe.delete(f"{self.ns}trace:{trajectory_id}")
        pipe.zrem(f"{self.ns}pending", trajectory_id)
        await pipe.execute()

    async def join(self, trajectory_id: str, feedback_id: str) -> str:
        """Join feedback to a trace, once: the id of the feedback that holds the trace."""
        key = f"{self.ns}joined:{trajectory_id}"
        if await self.redis.set(key, feedback_id, nx=True, ex=self.idem_ttl):
            return feedback_id
        holder = await self.redis.get(key)
        return feedback_id if holder is None else _text(holder)

    async def joined(self, trajectory_id: str) -> str | None:
        raw = await self.redis.get(f"{self.ns}joined:{trajectory_id}")
        return None if raw is None else _text(raw)


def _text(raw: bytes | str) -> str:
    return raw.decode() if isinstance(raw, bytes) else raw


async def pending_counts(redis: Redis, prefix: str) -> dict[str, int]:
    """Traces awaiting feedback, and those whose window passed unrated (recently)."""
    key = f"{namespace(prefix)}pending"
    now = time.time()
    waiting = await redis.zcount(key, now, "+inf")
    expired = await redis.zcount(key, "-inf", now)
    return {"awaiting_feedback": int(waiting), "expired_unrated": int(expired)}
