"""Verdict semantics through the real executor, run WITHOUT isolation (LocalRunner).

Only well-behaved and reward-hacking programs run here; the destructive ones (fork and
memory bombs, background survivors, killers) run in the hardened containers only
(tests/integration/test_sandbox_hostile.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace

import pytest

from sandbox_workers.local import LocalRunner
from sandbox_workers.sandbox import VerifyingSandbox
from schemas.sandbox import Outcome
from tests.unit.sandbox_programs import (
    ADD_TESTS,
    GOOD,
    REWARD_HACKS,
    WRONG,
    io_request,
    pt_request,
)


@pytest.fixture
async def sandbox() -> AsyncIterator[VerifyingSandbox]:
    sb = VerifyingSandbox(LocalRunner(concurrency=2))
    yield sb
    await sb.close()


async def test_pass_fail_and_partial(sandbox: VerifyingSandbox) -> None:
    r = await sandbox.run(pt_request(GOOD))
    assert (r.outcome, r.passed, r.total) == (Outcome.PASSED, 3, 3)
    assert (r.verifier_name, r.verifier_version) == ("python_tests", "1.1")
    r = await sandbox.run(pt_request(WRONG))
    assert (r.outcome, r.passed, r.total) == (Outcome.FAILED, 0, 3)
    assert "test_small" in r.detail and "add(1, 2) == 3" in r.detail
    partial = "def add(a, b):\n    return a + b if isinstance(a, int) and a > 0 else None\n"
    r = await sandbox.run(pt_request(partial))
    assert (r.outcome, r.passed, r.total) == (Outcome.FAILED, 1, 3)


@pytest.mark.parametrize(
    ("code", "outcome"),
    [
        ("def add(a, b:\n", Outcome.COMPILE_ERROR),
        ("raise RuntimeError('at import')\n", Outcome.RUNTIME_ERROR),
        ("x = bytearray(1 << 40)\n", Outcome.MEMORY_LIMIT),
        ("def add(a, b):\n    return bytearray(1 << 40)\n", Outcome.MEMORY_LIMIT),
        ("while True:\n    pass\n", Outcome.TIMEOUT),
    ],
)
async def test_failure_outcomes(sandbox: VerifyingSandbox, code: str, outcome: Outcome) -> None:
    r = await sandbox.run(pt_request(code, timeout_s=1.0))
    assert r.outcome == outcome, r.detail
    assert r.passed == 0 and r.total == 3


@pytest.mark.parametrize(("name", "code", "tests"), REWARD_HACKS, ids=[h[0] for h in REWARD_HACKS])
async def test_reward_hacks_never_pass(
    sandbox: VerifyingSandbox, name: str, code: str, tests: str | None
) -> None:
    r = await sandbox.run(pt_request(code, tests or ADD_TESTS))
    assert r.outcome != Outcome.PASSED, (name, r)
    assert r.passed < r.total or r.total == 0, (name, r)
    assert r.outcome in (Outcome.FAILED, Outcome.RUNTIME_ERROR, Outcome.TAMPER), (name, r)
    if name == "smuggle_tests_and_shadow_builtins":
        assert (r.passed, r.total) == (0, 2), r  # no smuggled test counted, no builtin shadowed


async def test_calls_objects_exceptions_and_mutation(sandbox: VerifyingSandbox) -> None:
    code = """
class Stack:
    def __init__(self):
        self.items = []
    def push(self, x):
        self.items.append(x)
    def pop(self):
        if not self.items:
            raise EmptyError("empty")
        return self.items.pop()
    def __len__(self):
        return len(self.items)

class EmptyError(IndexError):
    pass

def sort_in_place(xs):
    xs.sort()

def count_up(n):
    yield from range(n)

def check(n):
    if n < 0:
        raise ValueError("negative")
    return {"n": n, "sq": (n * n, float(n) / 2), "set": {n}}
"""
    tests = """
import pytest
import solution
from solution import Stack, sort_in_place, count_up, check

def test_stack():
    s = Stack()
    s.push(1); s.push(2)
    assert s.pop() == 2 and len(s) == 1

def test_custom_exception():
    with pytest.raises(solution.EmptyError):
        Stack().pop()
    with pytest.raises(IndexError, match="empty"):
        Stack().pop()

def test_mutation_is_copied_back():
    xs = [3, 1, 2]
    sort_in_place(xs)
    assert xs == [1, 2, 3]

def test_generator():
    assert list(count_up(3)) == [0, 1, 2]

def test_values_and_builtin_exceptions():
    assert check(3) == {"n": 3, "sq": (9, 1.5), "set": {3}}
    assert check(1)["sq"][1] == pytest.approx(0.5)
    with pytest.raises(ValueError):
        check(-1)

@pytest.mark.parametrize("n", [0, 1, 2, 3])
def test_param(n):
    assert check(n)["n"] == n

class TestGroup:
    def test_method(self):
        assert check(2)["n"] == 2

@pytest.mark.skip(reason="not collected")
def test_skipped():
    assert False
"""
    r = await sandbox.run(pt_request(code, tests))
    assert (r.outcome, r.passed, r.total) == (Outcome.PASSED, 10, 10), r.detail


@pytest.mark.parametrize(
    ("tests", "why"),
    [
        ("def test_x(:\n", "do not compile"),
        ("from solution import add\n\ndef helper():\n    pass\n", "no test_"),
        ("import not_a_module_anywhere\n\ndef test_x():\n    pass\n", "importing the tests"),
    ],
)
async def test_broken_tests_are_the_tasks_fault(
    sandbox: VerifyingSandbox, tests: str, why: str
) -> None:
    r = await sandbox.run(pt_request(GOOD, tests))
    assert r.outcome == Outcome.SANDBOX_ERROR and why in r.detail, r.detail


async def test_candidate_output_is_captured_and_capped(sandbox: VerifyingSandbox) -> None:
    code = "import sys\nprint('hello')\nprint('warn', file=sys.stderr)\n" + GOOD
    r = await sandbox.run(pt_request(code))
    assert r.outcome == Outcome.PASSED and r.stdout == "hello\n" and r.stderr == "warn\n"
    flood = "print('y' * 100_000)\n" + GOOD
    sandbox.limits = replace(sandbox.limits, keep_output=1000, output_limit=50_000)
    r = await sandbox.run(pt_request(flood))
    assert r.outcome == Outcome.OUTPUT_LIMIT and r.truncated and len(r.stdout) <= 1000


async def test_stdin_stdout(sandbox: VerifyingSandbox) -> None:
    prog = "a, b = map(int, input().split())\nprint(a + b, ' ')\n"
    cases = [("1 2\n", "3"), ("5 5\n", "10\n\n"), ("2 2\n", "5")]
    r = await sandbox.run(io_request(prog, cases))
    assert (r.outcome, r.passed, r.total) == (Outcome.FAILED, 2, 3)
    assert "case 3/3" in r.detail
    r = await sandbox.run(io_request(prog, cases[:2]))
    assert (r.outcome, r.passed, r.total) == (Outcome.PASSED, 2, 2)
    r = await sandbox.run(io_request("print(1/0)\n", cases[:2]))
    assert (r.outcome, r.passed) == (Outcome.RUNTIME_ERROR, 0)
    r = await sandbox.run(io_request("print(\n", cases[:2]))
    assert r.outcome == Outcome.COMPILE_ERROR
    r = await sandbox.run(io_request("print(3)\nexit()\nprint(4)\n", [("", "3")]))
    assert r.outcome == Outcome.PASSED, r.detail  # exit()/quit() work as in plain python
    r = await sandbox.run(io_request("import sys\nsys.exit(0)\n", cases[:2]))
    assert (r.outcome, r.passed) == (Outcome.FAILED, 0)
    r = await sandbox.run(io_request("while True:\n    pass\n", cases[:2], timeout_s=1.0))
    assert r.outcome == Outcome.TIMEOUT


async def test_unknown_verifier_and_version_are_sandbox_errors(sandbox: VerifyingSandbox) -> None:
    req = pt_request(GOOD)
    req.verifier.name = "nope"
    r = await sandbox.run(req)
    assert r.outcome == Outcome.SANDBOX_ERROR and "unknown verifier" in r.detail
    req = pt_request(GOOD)
    req.verifier.version = "0.1"
    r = await sandbox.run(req)
    assert r.outcome == Outcome.SANDBOX_ERROR and "not deployed" in r.detail
