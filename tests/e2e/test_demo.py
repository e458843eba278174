"""`rollstream demo` shortened, run as a user runs it; then the run's topics are read back.

Asserted: the pipeline's accounting (every published trajectory has exactly one fate in
the ledger: trained, or dropped/masked with a reason; every one that reached `rewards`
was judged by the learner; the others were dropped by the dispatcher with a reason), that
a new policy version reached the generators (trajectories sampled with version > 0), the
report files, and that nothing is left running (processes, sandbox containers). The
learning figure itself is reported by the demo, not asserted here.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from schemas import topics
from schemas.learning import LedgerEntry, LedgerStatus
from schemas.rollout import ScoredTrajectory, Trajectory
from services import kafka
from services.settings import Settings, load

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(600)


def run_demo(prefix: str, report_dir: Path) -> subprocess.CompletedProcess[str]:
    sets = {
        "demo.policy": "tiny",
        "demo.prefix": prefix,
        "demo.report_dir": str(report_dir),
        "demo.budget_minutes": "1",
        "demo.live": "false",
        "demo.warmup_steps": "40",
        "demo.eval_tasks": "16",
        "demo.eval_samples": "2",
        "demo.drain_s": "45",
    }
    args = [a for k, v in sets.items() for a in ("--set", f"{k}={v}")]
    return subprocess.run(
        [sys.executable, "-m", "services.cli", *args, "demo"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=540,
        env={**os.environ, "COLUMNS": "120"},
    )


async def read_back(s: Settings) -> dict[str, list[Any]]:
    """Every record of trajectories, rewards and ledger, decoded."""
    from services import blobs

    claim = blobs.from_settings(s)
    consumer = kafka.consumer(s, "test-demo-readback")
    await consumer.start()
    names = {
        kafka.topic(s, t): t.name for t in (topics.TRAJECTORIES, topics.REWARDS, topics.LEDGER)
    }
    out: dict[str, list[Any]] = {n: [] for n in names.values()}
    try:
        tps = await kafka.assign_all(s, consumer, list(names))
        ends = await consumer.end_offsets(tps)
        for _ in range(2000):  # bounded: stops once every partition is read to its end
            if all([await consumer.position(tp) >= ends[tp] for tp in tps]):
                break
            batches = await consumer.getmany(timeout_ms=500)
            for rec in (r for rs in batches.values() for r in rs):
                out[names[rec.topic]].append(await claim.unpack(rec.value))
    finally:
        await consumer.stop()
        await claim.aclose()
    return out


def test_short_demo(prefix: str, tmp_path: Path) -> None:
    done = run_demo(prefix, tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    run_dir = tmp_path / prefix
    summary = json.loads((run_dir / "summary.json").read_text())
    assert (run_dir / "plot.png").stat().st_size > 10_000 and (run_dir / "report.md").exists()
    assert {e["suite"] for e in summary["after"]} == {e["suite"] for e in summary["before"]}

    s = load([f"topics.prefix={prefix}"])
    seen = asyncio.run(read_back(s))
    trajs: list[Trajectory] = seen["trajectories"]
    scored: list[ScoredTrajectory] = seen["rewards"]
    ledger: list[LedgerEntry] = seen["ledger"]
    check_accounting(trajs, scored, ledger)
    assert max(t.policy_version for t in trajs) > 0, "no new policy reached the generators"
    assert summary["accounting"]["without (in flight at the stop)"] == 0
    check_nothing_left(json.loads((run_dir / "services.json").read_text()))


def check_accounting(
    trajs: list[Trajectory], scored: list[ScoredTrajectory], ledger: list[LedgerEntry]
) -> None:
    published = {t.id for t in trajs}
    assert len(published) > 100
    fates: dict[str, set[tuple[str, str]]] = {}
    for e in ledger:
        fates.setdefault(e.trajectory_id, set()).add((e.status.value, e.writer.split("@")[0]))
        if e.status is not LedgerStatus.TRAINED:
            assert e.reason.strip(), f"{e.status.value} without a reason: {e}"
    assert set(fates) == published, "trajectories without a ledger entry (or unknown ones)"
    assert all(len(f) == 1 for f in fates.values()), "a trajectory with two different fates"
    rewarded = {r.trajectory.id for r in scored}
    assert rewarded <= published
    for tid in published:
        ((status, writer),) = fates[tid]
        if tid in rewarded:
            assert writer == "learner", f"{tid}: scored but judged by {writer}"
        else:
            assert (status, writer) == ("dropped", "dispatcher"), f"{tid}: never scored"
    trained = sum(1 for ((status, _),) in fates.values() if status == "trained")
    # samples of all-equal groups are settled untrained (learner.skip_no_signal): they count
    # as taken up, stale or lost ones do not
    no_signal = {e.trajectory_id for e in ledger if e.reason.startswith("no signal")}
    assert trained > 0 and trained + len(no_signal) > len(published) / 2


def check_nothing_left(pids: dict[str, int]) -> None:
    for name, pid in pids.items():
        assert not _alive(pid), f"{name} (pid {pid}) is still running"
    from sandbox_workers.hardening import SANDBOX_LABEL
    from sandbox_workers.reaper import OWNER_LABEL
    from services.infra import docker_engine

    client = docker_engine.client(load())
    try:
        owners = {
            (c.labels or {}).get(OWNER_LABEL, "")
            for c in client.containers.list(all=True, filters={"label": SANDBOX_LABEL})
        }
    finally:
        client.close()
    ours = {o for o in owners if _owner_pid(o) in pids.values()}
    assert not ours, f"sandbox containers left behind by the demo: {ours}"


def _owner_pid(token: str) -> int:
    """The pid in a `host:pid:start` owner label (-1 when there is none)."""
    parts = token.split(":")
    return int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else -1


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state != "Z"
