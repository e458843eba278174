"""`rollstream calibrate` as a user runs it: counts from an exported rewards file and an
eval figure written to a calibration file the feeder reads; a bad source is a clear error
(exit 2) and writes nothing."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from schemas.rollout import ScoredTrajectory, Trajectory
from schemas.sandbox import Outcome, VerifierSpec
from services import logfiles
from services.suites import calibration

ROOT = Path(__file__).resolve().parents[2]


def rollstream(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "services.cli", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)  # fmt: skip


def test_calibrate_counts_runs_and_evaluations(tmp_path: Path) -> None:
    def scored(task_id: str, outcome: Outcome) -> bytes:
        traj = Trajectory(task_id=task_id, group_id="g", group_size=8,
                          verifier=VerifierSpec(name="python_tests", tests="t"))  # fmt: skip
        msg = ScoredTrajectory(trajectory=traj, reward=0.0, outcome=outcome)
        return logfiles.json_line(msg, topic="p.rewards")

    exported = tmp_path / "rewards.jsonl"
    exported.write_bytes(scored("code/a", Outcome.PASSED) + scored("code/a", Outcome.FAILED))
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
    not_scored = Trajectory(task_id="code/a", group_id="g", group_size=8,
                            verifier=VerifierSpec(name="python_tests", tests="t"))  # fmt: skip
    bad.write_bytes(logfiles.json_line(not_scored))
    out2 = tmp_path / "cal2.json"
    run = rollstream("calibrate", str(out2), "--from", str(bad))
    assert run.returncode == 2 and "no ScoredTrajectory" in run.stderr and not out2.exists()
