"""The warm pool runs as many jobs at once as it has containers, also past the size of
asyncio's default executor (min(32, cores + 4) threads: 6 on a 2-core machine)."""

from __future__ import annotations

import asyncio
import os
import threading
from typing import Any

from sandbox_workers.pool import ContainerPool, PoolConfig, Slot
from sandbox_workers.protocol import Execution


def _pool(size: int, barrier: threading.Barrier) -> ContainerPool:
    """A pool whose slots exist and whose job run is a barrier: it returns only once every
    container is running a job at the same moment (no Docker: this tests the scheduling)."""
    pool = ContainerPool(PoolConfig(image="unused", size=size))
    for i in range(size):
        pool._idle.put_nowait(Slot(id=f"slot{i:02d}", uid=1000 + i))

    def run_in(slot: Slot, job: dict[str, Any], limit_s: float) -> Execution:
        barrier.wait(timeout=20)  # BrokenBarrierError when fewer than `size` run at once
        ex = Execution({"outcome": "passed"}, started=True)
        ex.extra["clean"] = True
        return ex

    pool._run_in = run_in  # type: ignore[method-assign]
    return pool


def test_a_pool_larger_than_the_default_executor_runs_every_container_at_once() -> None:
    size = min(32, (os.cpu_count() or 1) + 4) + 4  # past asyncio's default executor
    barrier = threading.Barrier(size)
    pool = _pool(size, barrier)

    async def main() -> list[Execution]:
        jobs = [pool.execute({"job": i}, limit_s=1.0) for i in range(size)]
        out = await asyncio.gather(*jobs)
        await pool.close()
        return out

    results = asyncio.run(main())
    assert not barrier.broken
    assert [r.report for r in results] == [{"outcome": "passed"}] * size
    assert all(r.error == "" for r in results)
    assert not [t for t in threading.enumerate() if t.name.startswith("sandbox-pool-")]
