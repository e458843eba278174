"""The learner's recovery on the real stack: a corrupt newest checkpoint makes a restart
fall back to an older one, and the window flushed after it (ledger sent, offsets
committed) is not trained again: every trajectory keeps exactly one fate."""

from __future__ import annotations

from pathlib import Path

from schemas import codec
from schemas.messages import LedgerEntry
from services import topics
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


async def test_checkpoint_fallback_never_trains_a_flushed_window_twice(
    settings: Settings, prefix: str, tmp_path: Path, kafka_redis: None, redis_cleanup: None
) -> None:
    run = _run(settings, prefix)
    await topics.ensure(run)
    first = _batch(0, 48)  # 6 steps of 8: checkpoints at step 4 and at the stop (step 6)
    await _produce(run, prefix, _records(first))
    a = Child(tmp_path, "a", [*_overrides(prefix, tmp_path, "dir"), "--idle-exit", "3"])
    assert "DONE steps=6" in a.finish()
    ckpts = sorted((tmp_path / "ckpt" / prefix / "default").glob("ckpt-*"))
    assert len(ckpts) >= 2 and all((c / "FLUSHED").exists() for c in ckpts)
    (ckpts[-1] / "tensors.safetensors").write_bytes(b"\x00" * 64)  # the newest is corrupt

    second = _batch(48, 16)
    await _produce(run, prefix, _records(second))
    b = Child(tmp_path, "b", [*_overrides(prefix, tmp_path, "dir"), "--idle-exit", "4"])
    log = b.finish()
    assert f"skipping checkpoint {ckpts[-1]}" in log
    # the 16 records of steps 5 and 6 are skipped (positioned at the committed offsets, a
    # warning where the old checkpoint had an offset): only the 16 new ones are trained
    assert "'trained': 16}" in log.splitlines()[0], log[-3000:]
    entries = [codec.decode(v, LedgerEntry) for _, v in await _read(run, f"{prefix}.ledger")]
    fates = _fates(entries)
    assert set(fates) == {m.trajectory_id for m in first + second}
    twice = [t for t, f in fates.items() if len(f) > 1]
    assert twice == [], f"{len(twice)} trajectories have two fates"
