"""One active learner per policy: a Redis lease with a fencing token (issue 16).

Keys, under `rollstream:{prefix}:`:

- `learner-lease:{policy}`: `{holder}|{token}`, set with NX and a TTL of
  `learner.lease_ttl_s`, renewed every third of it by the holder.
- `learner-fence:{policy}`: the fencing token, INCR'd by each acquisition (so it only
  grows: a learner that held the lease before has a smaller one).

A learner takes the lease before it restores; while another holds it, it waits as a
standby and takes over once the holder's lease expires (the holder died or stalled past
the TTL). Every weight announcement, ledger write (the outbox), offset commit and
checkpoint save first checks that the lease still holds this learner's token: a learner
that lost it (paused past the TTL, its lease taken) raises `Fenced` and writes nothing
more. While Redis is unreachable the holder keeps the lease until the expiry it last set
(no one else can take it meanwhile); past that it is fenced too. A Redis that lost its
data loses the lease: the holder is fenced at its next write and the lease taken again.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from pathlib import Path

    from redis.asyncio import Redis
    from torch import Tensor

    from learner.checkpoint import CheckpointManager
    from learner.weights import StoredWeights, WeightStore
    from services.settings import Settings

log = logging.getLogger(__name__)

_ACQUIRE = """
if redis.call('set', KEYS[1], 'taking', 'NX', 'PX', ARGV[2]) then
  local token = redis.call('incr', KEYS[2])
  redis.call('set', KEYS[1], ARGV[1] .. '|' .. token, 'PX', ARGV[2])
  return token
end
return 0
"""
_RENEW = """
local held = redis.call('get', KEYS[1])
if held == ARGV[1] then
  return redis.call('pexpire', KEYS[1], ARGV[2])
end
if not held and redis.call('get', KEYS[2]) == ARGV[3] then
  redis.call('set', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 1
end
return 0
"""
"""Renew the lease; one that expired is taken back only if no one took it since (the
fencing token is still this holder's)."""
_RELEASE = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end"


class Fenced(RuntimeError):
    """This learner no longer holds its policy's lease: another one is active."""


class LearnerLease:
    """The lease of one learner process (acquire, then check before each write)."""

    def __init__(self, url: str, prefix: str, policy: str, ttl_s: float) -> None:
        from redis.asyncio import Redis

        self.url, self.ttl_ms = url, max(100, round(ttl_s * 1000))
        self.redis: Redis = Redis.from_url(url, socket_timeout=5)
        self.key = f"rollstream:{prefix}:learner-lease:{policy}"
        self.fence_key = f"rollstream:{prefix}:learner-fence:{policy}"
        self.holder = f"{socket.gethostname()}-{os.getpid()}-{os.urandom(3).hex()}"
        self.token = 0
        self.valid_until = 0.0
        self._renewer: asyncio.Task[None] | None = None
        self.on_lost: Callable[[], None] | None = None
        """Called when a renewal finds the lease lost (the learner stops writing)."""

    @classmethod
    def from_settings(cls, settings: Settings) -> LearnerLease:
        ls = settings.learner
        return cls(settings.redis.endpoint, settings.topics.prefix, ls.policy, ls.lease_ttl_s)

    @property
    def value(self) -> str:
        return f"{self.holder}|{self.token}"

    async def try_acquire(self) -> bool:
        started = time.monotonic()
        keys = (self.key, self.fence_key)
        token = int(await self.redis.eval(_ACQUIRE, 2, *keys, self.holder, self.ttl_ms))
        if token:
            self.token, self.valid_until = token, started + self.ttl_ms / 1000
        return bool(token)

    async def acquire(self, stop: asyncio.Event | None = None) -> bool:
        """Take the lease, waiting as a standby while another learner holds it; False if
        `stop` was set first."""
        announced = False
        while not (stop is not None and stop.is_set()):
            try:
                if await self.try_acquire():
                    log.info("lease %s taken: fencing token %d", self.key, self.token)
                    self._renewer = asyncio.create_task(self._renew_forever())
                    return True
                if not announced:
                    holder = await self.redis.get(self.key)
                    log.warning("standby: lease %s held by %r; waiting", self.key, holder)
                    announced = True
            except Exception as exc:  # Redis down or restarting: keep waiting
                log.warning("lease %s: %s", self.key, exc)
            await asyncio.sleep(self.ttl_ms / 4000)
        return False

    async def check(self) -> None:
        """Raise Fenced unless this learner still holds the lease (renews it)."""
        if not self.token:
            raise Fenced(f"{self.key}: not acquired")
        started = time.monotonic()
        try:
            held = await self.redis.eval(_RENEW, 2, *self._renew_args())
        except Exception as exc:  # unreachable: the lease holds until its last expiry
            if time.monotonic() < self.valid_until:
                return
            raise Fenced(f"{self.key}: Redis unreachable past the lease's expiry") from exc
        if not held:
            self.token = 0
            raise Fenced(f"{self.key}: lease lost (another learner is active)")
        self.valid_until = started + self.ttl_ms / 1000

    def check_sync(self) -> None:
        """`check` from a worker thread (the checkpoint save), on a client of its own."""
        import redis

        client: Any = redis.Redis.from_url(self.url, socket_timeout=5)
        try:
            if not self.token or not client.eval(_RENEW, 2, *self._renew_args()):
                raise Fenced(f"{self.key}: lease lost (another learner is active)")
        except redis.RedisError as exc:
            if time.monotonic() >= self.valid_until:
                raise Fenced(f"{self.key}: Redis unreachable past the lease's expiry") from exc
        finally:
            client.close()

    def _renew_args(self) -> tuple[str, str, str, int, int]:
        return self.key, self.fence_key, self.value, self.ttl_ms, self.token

    async def _renew_forever(self) -> None:
        while self.token:
            await asyncio.sleep(self.ttl_ms / 3000)
            try:
                await self.check()
            except Fenced as exc:
                log.error("fenced: %s", exc)
                if self.on_lost is not None:
                    self.on_lost()
                return

    async def release(self) -> None:
        if self._renewer is not None:
            self._renewer.cancel()
        try:
            if self.token:
                await self.redis.eval(_RELEASE, 1, self.key, self.value)
        except Exception as exc:  # it expires on its own
            log.warning("lease %s not released: %s", self.key, exc)
        finally:
            self.token = 0
            await self.redis.aclose()


class FencedStore:
    """A weight store that writes only while the lease holds (a fenced learner's blob
    could prune the active learner's)."""

    def __init__(self, inner: WeightStore, lease: LearnerLease) -> None:
        self.inner, self.lease = inner, lease

    def put(self, version: int, state: Mapping[str, Tensor]) -> StoredWeights:
        self.lease.check_sync()
        return self.inner.put(version, state)

    def get(self, uri: str, sha256: str) -> dict[str, Tensor]:
        return self.inner.get(uri, sha256)


def fence_checkpoints(checkpoints: CheckpointManager, lease: LearnerLease) -> None:
    """Checkpoints saved only while the lease holds: a fenced learner's checkpoint would
    be the newest, and a restart would send its outbox."""
    save = checkpoints.save

    def guarded(state: Any, model: Any, opt: Any) -> Path:
        lease.check_sync()
        return save(state, model, opt)

    setattr(checkpoints, "save", guarded)  # noqa: B010 (an instance's method, wrapped)
