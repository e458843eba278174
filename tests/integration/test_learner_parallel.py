"""`rollstream learner --nproc 2` on the real stack: two gloo ranks on the CPU, rank 0 alone
on Kafka/Redis; it trains, publishes complete weights, and the ledger has every
trajectory once; no rank outlives the job."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from schemas import codec
from schemas.messages import LedgerEntry, LedgerStatus
from services import topics
from services.settings import Settings
from tests.integration.test_learner_service import (  # noqa: F401 (fixtures)
    ROOT,
    _batch,
    _check_announcements,
    _fates,
    _overrides,
    _produce,
    _read,
    _records,
    _run,
    kafka_redis,
    redis_cleanup,
)


def _ranks_alive(prefix: str) -> list[str]:
    ps = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True, check=True)
    return [line for line in ps.stdout.splitlines() if prefix in line and "ps -eo" not in line]


def _learner(prefix: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """`rollstream learner --nproc 2` until idle; no rank may outlive it."""
    sets = [a for kv in _overrides(prefix, tmp_path, "redis") for a in ("--set", kv)]
    sets += ["--set", "learner.max_lag=100"]
    cmd = [sys.executable, "-m", "services.cli", *sets, "learner", "--nproc", "2",
           "--idle-exit", "4", "--max-seconds", "240"]  # fmt: skip
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    proc = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    assert not _ranks_alive(prefix), "a rank outlived the job"
    return proc


@pytest.mark.usefixtures("kafka_redis", "redis_cleanup")
async def test_two_ranks_train_publish_and_ledger_every_trajectory_once(
    settings: Settings, prefix: str, tmp_path: Path
) -> None:
    run = _run(settings, prefix)
    await topics.ensure(run)
    msgs = _batch(0, 64, version_of=0)
    await _produce(run, prefix, _records(msgs))
    first = _learner(prefix, tmp_path)
    more = _batch(64, 32, version_of=0)  # a second run resumes from the checkpoint
    await _produce(run, prefix, _records(more))
    proc = _learner(prefix, tmp_path)
    assert "resumed from ckpt-" in proc.stderr, proc.stderr[-4000:]
    msgs += more

    updates = await _check_announcements(run, prefix)
    assert updates and updates[-1].step >= 12  # 96 samples of 32 tokens, 8 per step
    entries = [codec.decode(v, LedgerEntry) for _, v in await _read(run, f"{prefix}.ledger")]
    fates = _fates(entries)
    assert set(fates) == {m.trajectory_id for m in msgs}
    assert all(len(f) == 1 for f in fates.values()), "a trajectory has two fates"
    assert all(f[0].status is LedgerStatus.TRAINED for f in fates.values())
    assert {e.writer for e in entries} == {entries[0].writer}  # rank 0 alone writes
    summary = proc.stdout.strip().splitlines()[-1]
    print(f"\n--nproc 2: {first.stdout.strip()} then {summary}; "
          f"{len(updates)} announcements, {len(fates)} trained once")  # fmt: skip


def _sigterm_after(
    cmd: list[str], env: dict[str, str], err: Path, pattern: str
) -> tuple[subprocess.Popen[bytes], bytes, str]:
    """Start `cmd`, SIGTERM it once `pattern` is in its stderr, wait (bounded) for its end."""
    with err.open("wb") as f:
        proc = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=f)
    try:
        deadline = time.monotonic() + 180
        while pattern not in err.read_text() and time.monotonic() < deadline:
            assert proc.poll() is None, err.read_text()[-4000:]
            time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc, out, err.read_text()


@pytest.mark.usefixtures("kafka_redis", "redis_cleanup")
async def test_sigterm_to_the_launcher_stops_every_rank_cleanly(
    settings: Settings, prefix: str, tmp_path: Path
) -> None:
    run = _run(settings, prefix)
    await topics.ensure(run)
    await _produce(run, prefix, _records(_batch(0, 40, version_of=0)))
    sets = [a for kv in _overrides(prefix, tmp_path, "redis") for a in ("--set", kv)]
    sets += ["--set", "learner.max_lag=100", "--set", "learner.checkpoint_every=100"]
    cmd = [sys.executable, "-m", "services.cli", *sets, "learner", "--nproc", "2",
           "--max-seconds", "240"]  # fmt: skip
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    proc, out, log = _sigterm_after(cmd, env, tmp_path / "err.log", "step 5 ")
    assert proc.returncode == 0, log[-4000:]
    assert not _ranks_alive(prefix), "a rank outlived the job"
    summary = json.loads(out.decode().strip().splitlines()[-1])
    assert summary["steps"] == 5 and summary["samples"] == {"trained": 40}
    ckpts = sorted((tmp_path / "ckpt" / prefix / "default").glob("ckpt-*"))
    assert ckpts  # the clean stop checkpointed (checkpoint_every is far away)
    updates = await _check_announcements(run, prefix)
    assert updates[-1].step == 5
