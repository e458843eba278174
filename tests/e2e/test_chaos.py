"""Soak (marker `soak`): `rollstream chaos --minutes 2` as a user runs it. The pipeline on
a stack of its own (Kafka and Redis on other ports and state dirs) while components are
SIGKILLed and restarted; the audit afterwards finds nothing lost, nothing trained twice,
no conflicting fates; every component (broker included) was killed at least 3 times.
Recovery times are printed, not asserted."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from services.chaos import COMPONENTS

pytestmark = [pytest.mark.soak, pytest.mark.timeout(2400)]
ROOT = Path(__file__).resolve().parents[2]


def test_chaos_two_minutes_loses_nothing(tmp_path: Path) -> None:
    run = subprocess.run(
        [sys.executable, "-m", "services.cli", "--set", f"demo.report_dir={tmp_path}",
         "chaos", "--minutes", "2", "--json"],
        cwd=ROOT, capture_output=True, text=True, timeout=2300,
    )  # fmt: skip
    assert run.stdout.strip(), run.stderr[-4000:]
    report = json.loads(run.stdout)
    print(json.dumps({k: report[k] for k in ("lost", "trained_twice", "conflicts")}))
    print(json.dumps(report["recoveries_s"]))
    assert (report["lost"], report["trained_twice"], report["conflicts"]) == (0, 0, 0), report
    assert report["recoveries_s"], "nothing was killed"
    for component in COMPONENTS:  # at least 3 rounds, whatever --minutes says
        assert report["strikes"].count(component) >= 3, report["strikes"]
    assert run.returncode == 0, run.stderr[-4000:]
