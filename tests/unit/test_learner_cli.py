"""`rollstream learner` is registered lazily: help never imports torch or aiokafka."""

from __future__ import annotations

import subprocess
import sys

PROBE = """
import sys, typer
from typer.testing import CliRunner
from services import cli_learner
app = typer.Typer()
@app.callback()
def root() -> None: ...
cli_learner.register(app)
runner = CliRunner()
top = runner.invoke(app, ["--help"])
sub = runner.invoke(app, ["learner", "--help"])
assert top.exit_code == 0 and "learner" in top.output, top.output
assert sub.exit_code == 0 and "--max-steps" in sub.output, sub.output
heavy = [m for m in ("torch", "aiokafka", "learner.loop", "transformers") if m in sys.modules]
print("HEAVY", heavy)
"""


def test_help_does_not_import_torch() -> None:
    out = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=60, check=False
    )
    assert out.returncode == 0, out.stderr
    assert "HEAVY []" in out.stdout, out.stdout
