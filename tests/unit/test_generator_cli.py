"""`rollstream generator` / `feeder` are registered lazily: help never imports torch,
aiokafka or docker; `--suite` weights are parsed with a clear error."""

from __future__ import annotations

import subprocess
import sys

import pytest
import typer

PROBE = """
import sys, typer
from typer.testing import CliRunner
from services import cli_rollout
app = typer.Typer()
@app.callback()
def root() -> None: ...
cli_rollout.register(app)
runner = CliRunner()
top = runner.invoke(app, ["--help"])
gen = runner.invoke(app, ["generator", "--help"])
feed = runner.invoke(app, ["feeder", "--help"])
assert top.exit_code == 0 and "generator" in top.output and "feeder" in top.output, top.output
assert gen.exit_code == 0 and "--max-groups" in gen.output, gen.output
assert feed.exit_code == 0 and "--task-file" in feed.output, feed.output
heavy = [m for m in ("torch", "aiokafka", "docker", "faust") if m in sys.modules]
print("HEAVY", heavy)
"""


def test_help_does_not_import_heavy_modules() -> None:
    out = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=60, check=False
    )
    assert out.returncode == 0, out.stderr
    assert "HEAVY []" in out.stdout, out.stdout


def test_suite_weights() -> None:
    from services.cli_rollout import _weights

    assert _weights(["arith=0.7", "pyfunc=0.3", "mine"]) == {
        "arith": 0.7,
        "pyfunc": 0.3,
        "mine": 1.0,
    }
    with pytest.raises(typer.BadParameter, match="NAME=WEIGHT"):
        _weights(["arith=lots"])
