"""The executor's verdict logic: the authenticated channel, outcomes, output comparison, and
the plain-data wire format (deploy/sandbox/files)."""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import signal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.unit.sandbox_files import load

judging = load("judging")
wire = load("wire")
KEY = b"k" * 32


def line(seq: int, key: bytes = KEY, **event: object) -> bytes:
    body = json.dumps({"seq": seq, **event}).encode()
    return hmac.new(key, body, hashlib.sha256).hexdigest().encode() + b" " + body + b"\n"


def reports(*lines: bytes) -> object:
    r = judging.Reports(KEY)
    for chunk in lines:
        r(chunk)
    return r


def honest(passed: int, total: int) -> list[bytes]:
    out, seq = [line(1, ev="plan", total=total)], 2
    for i in range(total):
        out.append(line(seq, ev="test", name=f"t{i}", ok=i < passed, error="", exc=""))
        seq += 1
    out.append(line(seq, ev="done", passed=passed, total=total))
    return out


def test_honest_reports_pass_and_fail() -> None:
    r = reports(*honest(3, 3))
    assert judging.judge_tests("stop", r, None, 0)["outcome"] == "passed"
    r = reports(*honest(1, 3))
    res = judging.judge_tests("stop", r, None, 0)
    assert (res["outcome"], res["passed"], res["total"]) == ("failed", 1, 3)


def test_a_line_without_the_secret_is_tamper() -> None:
    forged = [line(1, key=b"guess" * 8, ev="done", passed=5, total=5)]
    res = judging.judge_tests("stop", reports(*forged), None, 0)
    assert res["outcome"] == "tamper" and res["passed"] == 0


def test_replayed_or_reordered_lines_are_tamper() -> None:
    lines = honest(1, 2)
    replay = reports(*lines[:2], lines[1], *lines[2:])
    assert judging.judge_tests("stop", replay, None, 0)["outcome"] == "tamper"


def test_a_done_that_does_not_add_up_is_tamper() -> None:
    lines = [*honest(1, 2)[:-1], line(4, ev="done", passed=2, total=2)]
    assert judging.judge_tests("stop", reports(*lines), None, 0)["outcome"] == "tamper"


def test_partial_line_at_eof_is_tamper() -> None:
    r = reports(*honest(1, 1)[:2], b"deadbeef {")
    r(b"")
    assert r.closed and judging.judge_tests("eof", r, None, 0)["outcome"] == "tamper"


@pytest.mark.parametrize(
    ("how", "t_rc", "want"),
    [
        ("eof", -signal.SIGKILL, "tamper"),  # the harness was killed: never a pass
        ("eof", 3, "sandbox_error"),  # the harness failed by itself: our fault
        ("deadline", None, "timeout"),
        ("output", None, "output_limit"),
    ],
)
def test_no_verdict_is_never_a_pass(how: str, t_rc: int | None, want: str) -> None:
    r = reports(*honest(2, 2)[:-1])  # every test passed, but no "done"
    assert judging.judge_tests(how, r, None, t_rc)["outcome"] == want


def test_import_failures() -> None:
    def imp(**kw: object) -> object:
        return reports(line(1, ev="plan", total=1), line(2, ev="import", **kw),
                       line(3, ev="test", name="t", ok=False, error="", exc="", dead=True),
                       line(4, ev="done", passed=0, total=1))  # fmt: skip

    syntax = imp(kind="syntax", type="SyntaxError", msg="line 1")
    assert judging.judge_tests("stop", syntax, 1, 0)["outcome"] == "compile_error"
    mem = imp(kind="exception", type="MemoryError", msg="")
    assert judging.judge_tests("stop", mem, 1, 0)["outcome"] == "memory_limit"
    exited = imp(kind="exited", type="", msg="")
    assert judging.judge_tests("stop", exited, 0, 0)["outcome"] == "runtime_error"


def test_cpu_limit_signal_is_timeout() -> None:
    r = reports(*honest(1, 2))
    assert judging.judge_tests("stop", r, -signal.SIGXCPU, 0)["outcome"] == "timeout"


@pytest.mark.parametrize(
    ("got", "want", "same"),
    [
        ("1 2\n3\n", "1 2\n3", True),
        ("1 2   \n3\t\n\n\n", "1 2\n3\n", True),
        ("1 2\r\n3\r\n", "1 2\n3\n", True),
        (" 1 2\n3\n", "1 2\n3\n", False),  # leading space counts
        ("1  2\n3\n", "1 2\n3\n", False),  # inner spaces count
        ("1 2\n\n3\n", "1 2\n3\n", False),  # blank line in between counts
        ("Yes\n", "yes\n", False),
        ("", "\n\n", True),
    ],
)
def test_whitespace_rule(got: str, want: str, same: bool) -> None:
    assert (judging.difference(got, want) == "") is same


def test_cases_outcomes() -> None:
    c = judging.Cases(3)
    c.add("eof", 0, "ok\n", "3\n", "3")
    c.add("eof", 1, "ok\nexc:ZeroDivisionError\n", "", "4")
    c.add("eof", 0, "ok\n", "5\n", "6")
    res = c.result()
    assert (res["outcome"], res["passed"], res["total"]) == ("failed", 1, 3)
    crash_only = judging.Cases(1)
    crash_only.add("eof", 1, "ok\nexc:ValueError\n", "", "1")
    assert crash_only.result()["outcome"] == "runtime_error"
    compile_ = judging.Cases(2)
    assert compile_.add("eof", 1, "compile:line 1: bad", "", "1") == "stop"
    assert compile_.result()["outcome"] == "compile_error"


plain = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text()
    | st.binary(),
    lambda inner: st.lists(inner) | st.tuples(inner, inner)
    | st.dictionaries(st.text() | st.integers(), inner)
    | st.frozensets(st.integers() | st.text()),
    max_leaves=20,
)  # fmt: skip


@settings(max_examples=200, deadline=None)
@given(plain)
def test_wire_round_trip_keeps_exact_types(value: object) -> None:
    tree = json.loads(json.dumps(wire.encode(value)))
    back = wire.decode(tree)
    assert back == value and type(back) is type(value)


def test_wire_special_floats_and_big_ints() -> None:
    for v in (float("inf"), -0.0, 2**200, -(2**64), 1e-308, complex(1, -2)):
        back = wire.decode(json.loads(json.dumps(wire.encode(v))))
        assert back == v and type(back) is type(v)
    nan = wire.decode(wire.encode(float("nan")))
    assert math.isnan(nan)


def test_wire_refuses_behaviour() -> None:
    class Sneaky(int):
        def __eq__(self, other: object) -> bool:
            return True

        __hash__ = int.__hash__

    with pytest.raises(TypeError):
        wire.encode(Sneaky(1))  # a subclass is not plain data
    with pytest.raises(TypeError):
        wire.encode([lambda: 0])


@pytest.mark.parametrize(
    "tree",
    [
        {"zz": 1},
        {"l": "notalist"},
        {"s": [{"l": []}]},  # unhashable set item
        {"d": [[{"l": []}, 1]]},  # unhashable key
        {"x": "not-hex"},
        {"b": "!!!"},
        1.5,  # bare floats are not in the format
        2**60,  # bare ints beyond 2**53 are not either
        {"h": 1, "k": "object", "r": ""},  # a handle where none is allowed
        [1, 2],
    ],
)
def test_wire_malformed_values_are_errors(tree: object) -> None:
    with pytest.raises(wire.WireError):
        wire.decode(tree)


def test_wire_depth_cap() -> None:
    deep: object = None
    for _ in range(wire.MAX_DEPTH + 5):
        deep = {"l": [deep]}
    with pytest.raises(wire.WireError):
        wire.decode(deep)
