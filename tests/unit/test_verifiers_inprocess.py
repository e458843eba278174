"""The in-process verifiers: math_answer, exact, regex (with its time limit)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from fractions import Fraction

import pytest

from sandbox_workers.regex_guard import RegexGuard
from sandbox_workers.verifiers import Exact, MathAnswer, Regex, default_registry
from sandbox_workers.verifiers.math_answer import final_answer, parse_number
from schemas.sandbox import Outcome, VerifierSpec


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("42", Fraction(42)),
        ("-3.5", Fraction(-7, 2)),
        ("1,234,567", Fraction(1234567)),
        ("$1{,}000$", Fraction(1000)),
        ("\\frac{3}{4}", Fraction(3, 4)),
        ("-\\dfrac{1}{2}", Fraction(-1, 2)),
        ("6/8", Fraction(3, 4)),
        ("2.5e3", Fraction(2500)),
        ("45^\\circ", Fraction(45)),
        ("12 \\text{ cm}", Fraction(12)),
        ("50%", Fraction(50)),
        ("1e99999", None),  # exponent beyond the cap: not parsed (no giant integers)
        ("x+1", None),
        ("1/0", None),
        ("9" * 500, None),
    ],
)
def test_parse_number(text: str, value: Fraction | None) -> None:
    assert parse_number(text) == value


def test_final_answer() -> None:
    assert final_answer("so \\boxed{1} then \\boxed{\\frac{1}{2}}.") == "\\frac{1}{2}"
    assert final_answer("work...\n#### 72") == "72"
    assert final_answer("  7 ") == "7"


@pytest.mark.parametrize(
    ("answer", "reference", "ok"),
    [
        ("The answer is \\boxed{0.5}", "1/2", True),
        ("#### 1,000", "1000", True),
        ("\\boxed{0.3333333}", "\\frac{1}{3}", True),  # within 1e-6 relative
        ("\\boxed{0.333}", "\\frac{1}{3}", False),
        ("\\boxed{\\sqrt{2}}", "\\sqrt{2}", True),  # symbolic: text comparison
        ("\\boxed{\\sqrt{3}}", "\\sqrt{2}", False),
        ("\\boxed{}", "5", False),
        ("5 apples and 7 pears", "7", False),  # the whole text is not a number
    ],
)
async def test_math_answer(answer: str, reference: str, ok: bool) -> None:
    v = await MathAnswer().judge(answer, VerifierSpec(name="math_answer", answer=reference))
    assert (v.outcome == Outcome.PASSED) is ok and v.passed == int(ok) and v.total == 1


async def test_exact() -> None:
    spec = VerifierSpec(name="exact", answer="Paris")
    assert (await Exact().judge("  Paris\n", spec)).outcome == Outcome.PASSED
    assert (await Exact().judge("paris", spec)).outcome == Outcome.FAILED


@pytest.fixture
async def guard() -> AsyncIterator[RegexGuard]:
    g = RegexGuard()
    yield g
    await g.close()


async def test_regex_fullmatch_and_time_limit(guard: RegexGuard) -> None:
    rx = Regex(guard, timeout_s=0.5)
    spec = VerifierSpec(name="regex", pattern=r"[A-Z][a-z]+ \d{4}")
    assert (await rx.judge("Paris 2024\n", spec)).outcome == Outcome.PASSED
    assert (await rx.judge("Paris 2024 and more", spec)).outcome == Outcome.FAILED
    evil = VerifierSpec(name="regex", pattern=r"(a+)+$")
    v = await rx.judge("a" * 40 + "!", evil)  # catastrophic backtracking
    assert v.outcome == Outcome.TIMEOUT
    assert (await rx.judge("aaa", evil)).outcome == Outcome.PASSED  # the helper came back
    bad = VerifierSpec(name="regex", pattern="(")
    v = await rx.judge("x", bad)
    assert v.outcome == Outcome.SANDBOX_ERROR and "invalid pattern" in v.detail


def test_registry_names_and_lookup() -> None:
    reg = default_registry()
    assert reg.names() == ["exact", "math_answer", "python_tests", "regex", "stdin_stdout"]
    plugin, why = reg.lookup(VerifierSpec(name="python_tests", tests=""))
    assert plugin is None and "no tests" in why
    plugin, why = reg.lookup(VerifierSpec(name="exact", answer="x", version="1.0"))
    assert plugin is not None and why == ""
