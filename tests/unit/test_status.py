"""`rollstream status`'s pure parts and rendering, and the CLI staying light: help for the
ops commands imports none of fastapi, uvicorn, aiokafka, torch or docker."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from rich.console import Console

from services.status import GroupStatus, Snapshot, lag, staleness, trend
from services.status_view import render, sparkline

ROOT = Path(__file__).resolve().parents[2]


def test_lag_per_topic_over_committed_partitions() -> None:
    ends = {("p.rewards", 0): 10, ("p.rewards", 1): 5, ("p.ledger", 0): 7}
    committed = {("p.rewards", 0): 4}
    assert lag(committed, ends) == {"p.rewards": 6 + 5}
    assert lag({}, ends) == {}
    assert lag({("p.rewards", 0): 12, ("p.rewards", 1): 5}, ends) == {"p.rewards": 0}


def test_trend_slices_in_time_order() -> None:
    rewards = [(t, float(t >= 5)) for t in range(10)][::-1]  # unordered input
    assert trend(rewards, buckets=2) == [0.0, 1.0]
    assert trend(rewards, buckets=5) == [0.0, 0.0, 0.5, 1.0, 1.0]
    assert trend([(1, 0.25)], buckets=5) == [0.25]
    assert trend([]) == []


def test_staleness_of_known_versions() -> None:
    assert staleness(10, [10, 8, -1, 4]) == {"mean": 2.667, "max": 6.0, "n": 3}
    assert staleness(-1, [1]) == {} and staleness(3, [-1]) == {}
    assert staleness(2, [5]) == {"mean": 0.0, "max": 0.0, "n": 1}  # ahead after a restart


def test_render_shows_every_part() -> None:
    snap = Snapshot(prefix="p", taken_at=0.0)
    snap.groups = [GroupStatus("p.learner.default", 1, "Stable", {"p.rewards": 42})]
    snap.topic_records = {"rewards": 100, "dlq": 3}
    snap.throughput = {"rewards": 1.5}
    snap.learner = {"policy": "default", "version": 7, "step": 70, "samples_consumed": 900,
                    "published_s_ago": 2.0}  # fmt: skip
    snap.staleness = {"mean": 1.5, "max": 3.0, "n": 10}
    snap.reward_trend = [0.1, 0.5, 0.9]
    snap.sandbox = {"workers": 2, "backlog": 0, "containers": {"running": 4}}
    snap.ingest = {"awaiting_feedback": 5, "expired_unrated": 0}
    snap.dlq = 3
    console = Console(width=140, record=True)
    console.print(render(snap))
    text = console.export_text()
    for part in ("v7 step 70", "p.learner.default", "rewards 42", "▁▅█", "awaiting feedback 5",
                 "2 workers", "1.50", "mean 1.5"):  # fmt: skip
        assert part in text, part
    json.dumps(snap.to_json())  # JSON-able as is
    assert sparkline([]) == "" and sparkline([1.0, 1.0]) == "▁▁"


def test_ops_help_imports_nothing_heavy() -> None:
    code = (
        "import sys, typer\n"
        "from typer.testing import CliRunner\n"
        "from services.cli import app\n"
        "from services import cli_ops\n"
        "if 'replay' not in {c.name for c in app.registered_commands}:\n"
        "    cli_ops.register(app)\n"
        "runner = CliRunner()\n"
        "for args in (['--help'], ['replay', '--help'], ['export', '--help'],\n"
        "             ['ingest', '--help'], ['audit', '--help'], ['status', '--help']):\n"
        "    r = runner.invoke(app, args)\n"
        "    assert r.exit_code == 0, (args, r.output)\n"
        "heavy = {'fastapi', 'uvicorn', 'aiokafka', 'torch', 'docker', 'redis'}\n"
        "print(sorted(heavy & set(sys.modules)))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
