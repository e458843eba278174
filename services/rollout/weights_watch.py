"""The generator's view of `weights`: announcements in, verified weights out.

Reads the compacted `weights` topic from the beginning (the newest announcement of the
policy comes last), fetches the newest announced version that is not loaded yet, verifies
its sha256 (learner.weights.fetch) and its tensor names and shapes against the running
policy, and hands it over with `take()`; the generator loads it between sequences. A
missing, corrupt or mismatched blob is reported (log, dead letter, counter) and the old
weights stay; a later announcement is tried as usual. `samples_consumed` of the newest
announcement is kept for status views (pacing counts on `progress`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from schemas import codec, topics
from schemas.learning import WeightUpdate
from services import kafka

if TYPE_CHECKING:
    from torch import Tensor

    from services.settings import Settings

log = logging.getLogger("rollstream.generator.weights")


def state_problem(current: Mapping[str, tuple[int, ...]], new: Mapping[str, Tensor]) -> str | None:
    """Why a fetched state dict cannot be loaded into the running policy, or None."""
    missing = sorted(set(current) - set(new))
    extra = sorted(set(new) - set(current))
    if missing or extra:
        return f"tensor names differ: missing {missing[:3]}, unexpected {extra[:3]}"
    for name, shape in current.items():
        if tuple(new[name].shape) != tuple(shape):
            return f"{name}: shape {tuple(new[name].shape)}, the policy has {tuple(shape)}"
    return None


@dataclass
class Fetched:
    update: WeightUpdate
    state: dict[str, Any]


@dataclass
class WeightsWatcher:
    settings: Settings
    shapes: dict[str, tuple[int, ...]]
    """Tensor names and shapes of the running policy."""
    dead_letters: kafka.DeadLetters
    announced: WeightUpdate | None = None
    samples_consumed: int = 0
    consumed_at: float = field(default_factory=time.monotonic)
    """When samples_consumed last moved (monotonic clock)."""
    failures: int = 0
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    _ready: Fetched | None = None
    _loaded_version: int = -1
    _failed: set[int] = field(default_factory=set)
    _follower: kafka.Follower | None = None
    _fetching: asyncio.Task[None] | None = None
    _records: dict[int, kafka.KafkaRecord] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    async def start(self) -> None:
        names = [kafka.topic(self.settings, topics.WEIGHTS)]
        self._follower = kafka.Follower(self.settings, "rollstream-generator-weights", names)
        await self._follower.start(self._batch)

    async def stop(self) -> None:
        if self._follower is not None:
            await self._follower.stop()
        if self._fetching is not None:
            self._fetching.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._fetching

    def take(self) -> Fetched | None:
        """Verified weights newer than the loaded ones, once; the caller loads them. Safe
        from the sampling thread (in-flight updates)."""
        with self._lock:
            ready, self._ready = self._ready, None
            if ready is not None:
                self._loaded_version = ready.update.version
        return ready

    async def _batch(self, records: list[kafka.KafkaRecord]) -> None:
        for rec in records:
            await self._announcement(rec)
        want = self.announced
        idle = self._fetching is None or self._fetching.done()
        if want is not None and idle and self._wanted(want.version):
            self._fetching = asyncio.create_task(self._fetch(want))

    def _wanted(self, version: int) -> bool:
        newest_known = max(self._loaded_version, self._ready.update.version if self._ready else -1)
        return version > newest_known and version not in self._failed

    async def _announcement(self, rec: kafka.KafkaRecord) -> None:
        if rec.value is None:
            return  # a tombstone: compaction bookkeeping, nothing to load
        try:
            update = codec.decode(rec.value, WeightUpdate)
        except codec.SchemaError as exc:
            await self.dead_letters.send(rec, f"undecodable WeightUpdate: {exc}", exc)
            return
        if update.policy != self.settings.learner.policy:
            return
        self._records[update.version] = rec
        if update.samples_consumed > self.samples_consumed:
            self.samples_consumed = update.samples_consumed
            self.consumed_at = time.monotonic()
            self.changed.set()
        if self.announced is None or update.version > self.announced.version:
            self.announced = update

    async def _fetch(self, update: WeightUpdate) -> None:
        from learner.weights import fetch

        try:
            state = await asyncio.to_thread(
                fetch, update.uri, update.sha256, redis_url=self.settings.redis.endpoint
            )
            problem = state_problem(self.shapes, state)
            if problem:
                raise ValueError(problem)
        except Exception as exc:  # reported, never fatal: the old weights stay
            await self._report(update, exc)
            return
        with self._lock:
            self._ready = Fetched(update, state)
        self.changed.set()

    async def _report(self, update: WeightUpdate, exc: BaseException) -> None:
        from services.rollout import metrics

        self.failures += 1
        metrics.WEIGHT_FAILURES.inc()
        self._failed.add(update.version)
        reason = (
            f"weights v{update.version} at {update.uri} unusable, keeping "
            f"v{self._loaded_version}: {type(exc).__name__}: {exc}"
        )
        log.error("%s", reason)
        rec = self._records.pop(update.version, None)
        if rec is not None:
            with contextlib.suppress(Exception):
                await self.dead_letters.send(rec, reason[:2000], exc)
