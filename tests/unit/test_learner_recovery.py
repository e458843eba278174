"""Learner recovery (issue 16): weights re-published when the store lost the announced
blob; ledger and offsets committed on a stream of only stale or masked samples; a
checkpoint fallback (corrupt newest checkpoint) never trains a flushed window twice."""

from __future__ import annotations

import shutil
from pathlib import Path

from learner.weights import DirWeightStore, announced_readable
from schemas import codec
from schemas.messages import WeightUpdate

from .test_learner_loop import FakeIO, _learner, _msg


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
