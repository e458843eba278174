"""The sandbox worker's stall clock (sandbox_workers/service.py): how long the publication
under way has run, which the service's watchdog compares with sandbox.publish_stall_s."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

from sandbox_workers.config import SandboxSettings
from sandbox_workers.service import SandboxWorker, stall_s


def test_stall_is_zero_without_a_publication_and_grows_with_one() -> None:
    assert stall_s(None, 100.0) == 0.0
    assert stall_s(40.0, 100.0) == 60.0
    assert stall_s(100.0, 99.0) == 0.0  # clocks never run backwards into a negative stall


class _HangingIO:
    """WorkerIO whose publish waits until released (a wedged Kafka client)."""

    def __init__(self) -> None:
        self.release = asyncio.Event()

    async def publish(self, outputs: Sequence[Any], offsets: Mapping[Any, tuple[int, str]]) -> None:
        await self.release.wait()


async def test_the_clock_runs_while_publishing_and_stops_after() -> None:
    io = _HangingIO()
    w = SandboxWorker(SandboxSettings(), io, None, "w", None, _NoDedup())  # type: ignore[arg-type]
    entry = w.outbox.add(("t", 0), 0)
    w.outbox.finish(entry, [])
    flushing = asyncio.ensure_future(w.flush())
    await asyncio.sleep(0.05)
    assert w.publishing_since is not None
    assert w.stalled_for(w.publishing_since + 5.0) == 5.0
    io.release.set()
    await asyncio.wait_for(flushing, 5)
    assert w.publishing_since is None and w.stalled_for(1e9) == 0.0


class _NoDedup:
    async def remember(self, keys: Sequence[str]) -> None:
        return None
