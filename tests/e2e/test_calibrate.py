"""`rollstream calibrate` as a user runs it: counts from an exported rewards file and an
eval figure written to a calibration file the feeder reads; a bad source is a clear error
(exit 2) and writes nothing."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from services.suites import calibration

ROOT = Path(__file__).resolve().parents[2]


def rollstream(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "services.cli", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)  # fmt: skip


def test_calibrate_counts_runs_and_evaluations(tmp_path: Path) -> None:
    def scored(task_id: str, outcome: str) -> str:
        msg = {"schema": "ScoredTrajectory", "trajectory": {"task_id": task_id},
               "outcome": outcome, "masked": False}  # fmt: skip
        return json.dumps({"topic": "p.rewards", "message": msg})

    exported = tmp_path / "rewards.jsonl"
    exported.write_text("\n".join([scored("code/a", "passed"), scored("code/a", "failed")]))
    fig = tmp_path / "eval.json"
    fig.write_text(json.dumps({"samples": 2, "sampled_passed": {"code/a": 0, "code/b": 1},
                               "greedy_passed": ["code/b"]}))  # fmt: skip
    out = tmp_path / "cal.json"
    run = rollstream("calibrate", str(out), "--from", str(exported), "--from", str(fig),
                     "--model", "m", "--temperature", "0.7")  # fmt: skip
    assert run.returncode == 0, run.stderr
    cal = calibration.load(out)
    assert cal.tasks == {"code/a": (1, 5), "code/b": (2, 3)}
    assert (cal.model, cal.temperature, cal.sources) == ("m", 0.7, ["rewards.jsonl", "eval.json"])

    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"message": {"schema": "Trajectory"}}\n')
    out2 = tmp_path / "cal2.json"
    run = rollstream("calibrate", str(out2), "--from", str(bad))
    assert run.returncode == 2 and "no ScoredTrajectory" in run.stderr and not out2.exists()
