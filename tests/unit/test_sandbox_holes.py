"""The harness holes of issue 12, through the real job server run WITHOUT isolation
(LocalRunner). Each test here failed on the executor before the job server."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from sandbox_workers.local import LocalRunner
from sandbox_workers.sandbox import VerifyingSandbox
from schemas.sandbox import Outcome
from tests.unit.sandbox_programs import pt_request

CONTROL_FLOW = ["StopIteration", "StopAsyncIteration", "GeneratorExit", "KeyboardInterrupt",
                "SystemExit"]  # fmt: skip

# tests that a candidate raising a control-flow exception from `add` must never pass
SHORT_CIRCUITS = """
from solution import add
PAIRS = [(1, 2), (3, 4), (5, 6)]

def test_all_map():
    assert all(map(lambda p: add(*p) == p[0] + p[1], PAIRS))

def test_not_any_map():
    assert not any(map(lambda p: add(*p) != p[0] + p[1], PAIRS))

def test_sum_map():
    assert sum(map(lambda p: add(*p), PAIRS)) >= 0

def test_for_over_generator():
    def results():
        for a, b in PAIRS:
            yield add(a, b)
    for got in results():
        assert got is not None

def test_list_of_filter():
    assert list(filter(lambda p: add(*p) != sum(p), PAIRS)) == []

def test_next_default():
    assert next(map(lambda p: add(*p), PAIRS), 3) == 3

def test_catch_exception():
    try:
        add(1, 2)
    except ValueError:
        return
    assert add(1, 2) == 3
"""


@pytest.fixture
async def sandbox() -> AsyncIterator[VerifyingSandbox]:
    sb = VerifyingSandbox(LocalRunner(concurrency=2))
    yield sb
    await sb.close()


@pytest.mark.parametrize("exc", CONTROL_FLOW)
@pytest.mark.parametrize("how", ["builtin", "subclass", "subclass_not_exported"])
async def test_candidate_control_flow_exceptions_never_end_a_test(
    sandbox: VerifyingSandbox, exc: str, how: str
) -> None:
    """Hole 1: a rebuilt StopIteration (and the rest of its class) ended `map` inside
    `all`, so `assert all(map(...))` passed on a candidate that only raises."""
    if how == "builtin":
        code = f"def add(a, b):\n    raise {exc}\n"
    elif how == "subclass":
        code = f"class Stop({exc}):\n    pass\n\ndef add(a, b):\n    raise Stop()\n"
    else:
        code = f"def add(a, b):\n    class Stop({exc}):\n        pass\n    raise Stop()\n"
    r = await sandbox.run(pt_request(code, SHORT_CIRCUITS))
    assert r.passed == 0 and r.total == 7, (exc, how, r.outcome, r.detail)
    assert r.outcome in (Outcome.FAILED, Outcome.RUNTIME_ERROR), r.detail


async def test_an_exhausted_candidate_iterator_cannot_end_an_outer_loop(
    sandbox: VerifyingSandbox,
) -> None:
    code = "def numbers():\n    return iter([])\n"
    tests = (
        "from solution import numbers\n\n"
        "def test_next_in_map():\n"
        "    it = numbers()\n"
        "    assert all(map(lambda x: next(it) == x, [1, 2, 3]))\n"
    )
    r = await sandbox.run(pt_request(code, tests))
    assert (r.outcome, r.passed) == (Outcome.FAILED, 0), r.detail


async def test_only_the_declared_type_matches_a_candidate_exception(
    sandbox: VerifyingSandbox,
) -> None:
    """Explicit `pytest.raises` / `except` of the declared type (or a base) still work;
    other types and the implicit machinery do not."""
    code = (
        "class Empty(IndexError):\n    pass\n\n"
        "def stop():\n    raise StopIteration('done')\n\n"
        "def bye():\n    raise SystemExit(3)\n\n"
        "def empty():\n    raise Empty('nothing')\n\n"
        "def count(n):\n    yield from range(n)\n"
    )
    tests = """
import pytest
import solution
from solution import stop, bye, empty, count

def test_raises_declared():
    with pytest.raises(StopIteration, match="done") as info:
        stop()
    assert info.type is StopIteration
    with pytest.raises(SystemExit):
        bye()
    with pytest.raises(LookupError):
        empty()
    with pytest.raises(solution.Empty):
        empty()

def test_except_declared_and_bases():
    for fn, kinds in ((stop, (StopIteration, Exception)), (empty, (IndexError, LookupError))):
        for kind in kinds:
            try:
                fn()
            except kind as e:
                assert str(e)
            else:
                raise AssertionError("not caught")
    try:
        bye()
    except (ValueError, SystemExit):
        pass

def test_system_exit_is_not_an_exception():
    try:
        try:
            bye()
        except Exception:
            raise AssertionError("SystemExit caught as an Exception")
    except BaseException as e:
        assert type(e).__name__ == "SystemExit"

def test_iteration_still_works():
    assert list(count(3)) == [0, 1, 2]
    assert [x for x in count(2)] == [0, 1]
    assert next(iter(count(1))) == 0
    with pytest.raises(StopIteration):
        next(iter(count(0)))
"""
    r = await sandbox.run(pt_request(code, tests))
    assert (r.outcome, r.passed, r.total) == (Outcome.PASSED, 4, 4), r.detail


async def test_a_dead_candidate_never_satisfies_pytest_raises(sandbox: VerifyingSandbox) -> None:
    """Hole 3: `pytest.raises(Exception)` was satisfied by a candidate process that died."""
    tests = (
        "import pytest\nfrom solution import add\n\n"
        "def test_rejects_none():\n    with pytest.raises(Exception):\n        add(1, None)\n\n"
        "def test_rejects_anything():\n"
        "    try:\n        add(1, [])\n    except BaseException:\n        pass\n"
        "    else:\n        raise AssertionError('did not raise')\n"
    )
    suicide = "import os, signal\ndef add(a, b):\n    os.kill(os.getpid(), signal.SIGKILL)\n"
    for code in ("import os\ndef add(a, b):\n    os._exit(0)\n", suicide):
        r = await sandbox.run(pt_request(code, tests))
        assert r.passed == 0 and r.total == 2, r
        assert r.outcome == Outcome.RUNTIME_ERROR, r.detail
    honest = "def add(a, b):\n    return a + b\n"  # raises TypeError on None and on a list
    r = await sandbox.run(pt_request(honest, tests))
    assert (r.outcome, r.passed) == (Outcome.PASSED, 2), r.detail


@pytest.mark.parametrize(
    "tests",
    [
        "from solution import SIZE\nDATA = list(range(SIZE))\n\ndef test_x():\n    pass\n",
        "import solution\nclass TestX(solution.Base):\n    def test_x(self):\n        pass\n",
        "from solution import add\nTOTAL = add(1, 2) + 1\n\ndef test_x():\n    pass\n",
    ],
)
async def test_an_import_failure_found_later_is_the_models_failure(
    sandbox: VerifyingSandbox, tests: str
) -> None:
    """Hole 6: the candidate failed to import, and the tests' own import then failed on the
    missing names: reported as a task error (sandbox_error, masked from training)."""
    code = "import nonexistent_module_xyz\nSIZE = 3\n"
    r = await sandbox.run(pt_request(code, tests))
    assert r.outcome == Outcome.RUNTIME_ERROR, r.detail
    assert "nonexistent_module_xyz" in r.detail, r.detail
