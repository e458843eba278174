"""Soak (marker `soak`): the tiny pipeline on a local 3-broker KRaft cluster through the
SIGKILL of one broker.

The cluster is the test's own (own state dir and ports, cluster_helpers). Topics are
created with replication 3 and min.insync.replicas 2 (asserted through the admin API).
`rollstream demo` runs the pipeline with 2 generators, 2 dispatchers and 2 sandbox
workers; a minute into it broker 1 (the first bootstrap server) is SIGKILLed, and started
again 45 s later by `rollstream up --brokers 3`. After the demo drained and stopped,
`rollstream audit --finished`: 0 lost (unaccounted), 0 conflicting fates, and no
trajectory trained twice in the raw ledger. The throughput dip and the recovery time are
printed (and written to soak.json), not asserted.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from schemas.learning import LedgerStatus
from tests.e2e.test_demo import read_back
from tests.integration import cluster_helpers as ch

pytestmark = [pytest.mark.soak, pytest.mark.timeout(1800)]
KILLED = 1
KILL_AFTER_S = 60.0
DOWN_FOR_S = 45.0


def _rows(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _now_t(path: Path) -> float:
    """The demo's clock (seconds since the pipeline started) now, from its last row."""
    rows = _rows(path)
    return float(rows[-1]["t"]) + (time.time() - path.stat().st_mtime) if rows else 0.0


def _wait_for(demo: subprocess.Popen[bytes], log: Path, metrics: Path, t: float) -> None:
    deadline = time.monotonic() + 900
    while time.monotonic() < deadline:
        assert demo.poll() is None, f"demo exited ({demo.returncode}):\n{log.read_text()[-4000:]}"
        rows = _rows(metrics)
        if rows and rows[-1]["t"] >= t and rows[-1]["scored"] > 0:
            return
        time.sleep(1)
    pytest.fail(f"the pipeline did not reach t={t}s with scored trajectories")


def throughput_figures(rows: list[dict[str, Any]], t_kill: float, t_up: float) -> dict[str, Any]:
    """Scored trajectories per second between consecutive rows: the mean over the minute
    before the kill (baseline), the lowest 10 s average after it, and the recovery time:
    from the kill to the first 10 s window back at 80 % of the baseline."""
    pts = [(float(r["t"]), int(r["scored"])) for r in rows]

    def rate(a: float, b: float) -> float:
        inside = [(t, n) for t, n in pts if a <= t <= b]
        if len(inside) < 2 or inside[-1][0] - inside[0][0] <= 0:
            return 0.0
        return (inside[-1][1] - inside[0][1]) / (inside[-1][0] - inside[0][0])

    baseline = rate(max(0.0, t_kill - 60), t_kill)
    windows = [(t, rate(t, t + 10)) for t, _ in pts if t_kill <= t <= pts[-1][0] - 10]
    low = min((r for _, r in windows), default=0.0)
    back = next((t for t, r in windows if r >= 0.8 * baseline and t > t_kill + 5), None)
    return {
        "killed": f"kafka-{KILLED}",
        "t_kill_s": round(t_kill, 1),
        "t_restart_s": round(t_up, 1),
        "baseline_scored_per_s": round(baseline, 2),
        "lowest_10s_scored_per_s": round(low, 2),
        "dip_pct": round(100 * (1 - low / baseline), 1) if baseline else None,
        "recovery_s": round(back + 10 - t_kill, 1) if back is not None else None,
    }


def _start_demo(env: dict[str, str], prefix: str, report_dir: Path, log: Path) -> Any:
    sets = {
        "demo.prefix": prefix,
        "demo.policy": "tiny",
        "demo.report_dir": str(report_dir),
        "demo.budget_minutes": "4",
        "demo.live": "false",
        "demo.warmup_steps": "40",
        "demo.eval_tasks": "16",
        "demo.eval_samples": "2",
        "demo.drain_s": "90",
        "demo.generators": "2",
        "demo.dispatchers": "2",
        "demo.sandbox_workers": "2",
    }
    args = [a for k, v in sets.items() for a in ("--set", f"{k}={v}")]
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "services.cli", *args, "demo"],
            cwd=ch.ROOT,
            env={**env, "COLUMNS": "120"},
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def test_pipeline_survives_a_broker_kill(tmp_path: Path, prefix: str) -> None:
    state = tmp_path / "state"
    pairs = {**ch.cluster_pairs(state, prefix, ch.free_port_base()), "kafka.heap": "512m"}
    env, settings = ch.cluster_env(pairs), ch.cluster_settings(pairs)
    demo = None
    log, metrics = tmp_path / "demo.log", tmp_path / prefix / "metrics.jsonl"
    try:
        checks = {c["component"]: c for c in ch.up_json(env, "kafka,topics")}
        assert checks["kafka"]["healthy"] and checks["topics"]["healthy"], checks
        layout = asyncio.run(ch.topic_layout(settings))
        assert layout and set(layout.values()) == {(3, "2")}, layout

        demo = _start_demo(env, prefix, tmp_path, log)
        _wait_for(demo, log, metrics, KILL_AFTER_S)
        ch.kill_node(state, KILLED)
        t_kill = _now_t(metrics)
        time.sleep(DOWN_FOR_S)
        t_up = _now_t(metrics)
        again = {c["component"]: c for c in ch.up_json(env, "kafka")}
        assert again["kafka"]["healthy"], again
        assert demo.wait(timeout=1200) == 0, log.read_text()[-6000:]

        audit = ch.rollstream(env, "audit", "--prefix", prefix, "--finished", "--json")
        report = json.loads(audit.stdout)
        ledger = asyncio.run(read_back(settings))["ledger"]
        trained = Counter(e.trajectory_id for e in ledger if e.status is LedgerStatus.TRAINED)
        figures = {
            **throughput_figures(_rows(metrics), t_kill, t_up),
            "audit_ok": report["ok"],
            "published": report["published"],
            "trained": report["trained"],
            "dropped": report["dropped"],
            "masked": report["masked"],
            "unaccounted": report["unaccounted"],
            "conflicts": len(report["conflicts"]),
            "trained_twice": sum(1 for n in trained.values() if n > 1),
        }
        (tmp_path / "soak.json").write_text(json.dumps(figures, indent=2))
        print("\nSOAK " + json.dumps(figures))
        assert audit.returncode == 0 and report["ok"], audit.stdout + audit.stderr
        assert report["published"] > 0 and report["trained"] > 0
        assert report["unaccounted"] == 0 and report["conflicts"] == {}
        assert figures["trained_twice"] == 0
    finally:
        if demo is not None and demo.poll() is None:
            os.killpg(demo.pid, signal.SIGTERM)  # the demo stops every service it started
            try:
                demo.wait(timeout=120)
            except subprocess.TimeoutExpired:
                os.killpg(demo.pid, signal.SIGKILL)
        ch.down_and_check(env, state)
