"""`rollstream sandbox exec`, as a person or a script would run it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from services.settings import load
from tests.integration.sandbox_leaks import owned_by
from tests.unit.sandbox_programs import ADD_TESTS, GOOD, WRONG

ROOT = Path(__file__).resolve().parents[2]


def rollstream(*args: str) -> subprocess.CompletedProcess[str]:
    """Run the CLI; fail if it left a sandbox container behind."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "services.cli", *args], cwd=ROOT, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    out, err = proc.communicate(timeout=120)
    assert not owned_by(load(), [proc.pid]), "the CLI left a sandbox container behind"
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


@pytest.mark.parametrize(
    ("code", "rc", "outcome", "reward"), [(GOOD, 0, "passed", 1.0), (WRONG, 1, "failed", 0.0)]
)
def test_exec_python_tests_json(
    tmp_path: Path, _stack_up: None, code: str, rc: int, outcome: str, reward: float
) -> None:
    (tmp_path / "sol.py").write_text(code)
    (tmp_path / "tests.py").write_text(ADD_TESTS)
    proc = rollstream(
        "sandbox", "exec", "--code", str(tmp_path / "sol.py"), "--tests",
        str(tmp_path / "tests.py"), "--json",
    )  # fmt: skip
    assert proc.returncode == rc, proc.stderr
    result = json.loads(proc.stdout)
    assert (result["outcome"], result["total"], result["reward"]) == (outcome, 3, reward)
    assert (
        result["image_digest"].startswith("sha256:") and result["verifier_name"] == "python_tests"
    )


def test_exec_cases_human_readable(tmp_path: Path, _stack_up: None) -> None:
    (tmp_path / "prog.py").write_text("print(sum(map(int, input().split())))\n")
    (tmp_path / "cases.json").write_text(json.dumps([{"stdin": "1 2\n", "stdout": "3"}]))
    proc = rollstream(
        "sandbox", "exec", "--code", str(tmp_path / "prog.py"), "--cases",
        str(tmp_path / "cases.json"), "--timeout", "5",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "outcome:   passed" in proc.stdout and "reward:    1" in proc.stdout


def test_exec_math_answer_in_process(tmp_path: Path) -> None:
    (tmp_path / "answer.txt").write_text("so the answer is \\boxed{\\frac{1}{2}}")
    proc = rollstream(
        "sandbox", "exec", "--code", str(tmp_path / "answer.txt"), "--verifier", "math_answer",
        "--answer", "0.5", "--json",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["outcome"] == "passed"


def test_exec_bad_cases_file_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "prog.py").write_text("print(1)\n")
    (tmp_path / "cases.json").write_text('[{"stdin": 1}]')
    proc = rollstream(
        "sandbox", "exec", "--code", str(tmp_path / "prog.py"), "--cases",
        str(tmp_path / "cases.json"),
    )  # fmt: skip
    assert proc.returncode == 2 and "cases.json" in proc.stderr
