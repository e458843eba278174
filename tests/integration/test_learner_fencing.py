"""One active learner per policy (issue 16): a second learner stands by while the first
holds the lease, takes over when the first is SIGKILLed, and the ledger has no trajectory
trained twice; a learner whose lease was taken is fenced at its next write."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest

from schemas import codec
from schemas.messages import LedgerEntry, LedgerStatus
from services import topics
from services.learner_lease import Fenced, LearnerLease
from services.settings import Settings

from .test_learner_service import (
    Child,
    _batch,
    _fates,
    _overrides,
    _produce,
    _read,
    _records,
    _run,
    kafka_redis,
    redis_cleanup,
)

__all__ = ["kafka_redis", "redis_cleanup"]
TTL = "learner.lease_ttl_s=3"


async def test_standby_learner_takes_over_and_nothing_is_trained_twice(
    settings: Settings, prefix: str, tmp_path: Path, kafka_redis: None, redis_cleanup: None
) -> None:
    run = _run(settings, prefix)
    await topics.ensure(run)
    first = _batch(0, 48)
    await _produce(run, prefix, _records(first))
    a = Child(tmp_path, "a", [*_overrides(prefix, tmp_path, "redis"), TTL])
    a.wait_for(r"step 4 ")
    b = Child(tmp_path, "b", [*_overrides(prefix, tmp_path, "redis"), TTL, "--idle-exit", "6"])
    b.wait_for(r"standby: lease \S+ held by")
    a.wait_for(r"step 6 ")
    a.wait_idle()
    assert not re.search(r"step \d+ ", b.text()), "the standby trained"
    a.kill()
    second = _batch(48, 16)
    await _produce(run, prefix, _records(second))
    log = b.finish()
    assert re.search(r"lease \S+ taken: fencing token \d+", log)
    assert re.search(r"step \d+ ", log), "the standby never took over"
    entries = [codec.decode(v, LedgerEntry) for _, v in await _read(run, f"{prefix}.ledger")]
    fates = _fates(entries)
    assert set(fates) == {m.trajectory_id for m in first + second}
    twice = [t for t, f in fates.items() if len(f) > 1]
    assert twice == [], f"{len(twice)} trajectories have two fates"
    trained = [f[0] for f in fates.values() if f[0].status is LedgerStatus.TRAINED]
    assert len(trained) >= 48


async def test_a_learner_whose_lease_was_taken_is_fenced(
    settings: Settings, prefix: str, kafka_redis: None, redis_cleanup: None
) -> None:
    url = settings.redis.endpoint
    old, new = LearnerLease(url, prefix, "p", 0.3), LearnerLease(url, prefix, "p", 0.3)
    try:
        assert await old.try_acquire()
        await old.check()  # holds
        assert not await new.try_acquire()  # refused while held
        await asyncio.sleep(0.5)  # the holder stalls past its TTL (no renewal)
        assert await new.try_acquire() and new.token > old.token
        with pytest.raises(Fenced):
            await old.check()
        with pytest.raises(Fenced):
            await asyncio.to_thread(old.check_sync)
        await new.check()
    finally:
        await old.release()
        await new.release()
