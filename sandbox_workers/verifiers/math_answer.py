"""math_answer: is the candidate's final answer the reference number? (in-process)

The answer text is the request's `code`. Its final answer is the content of the last
`\\boxed{...}`, else what follows the last `####`, else the whole text. Both sides are read
as exact rationals where they can be: integers (with or without thousands commas),
decimals, scientific notation (an exponent of at most 4 digits), `a/b`, `\\frac{a}{b}`
(`\\dfrac`, `\\tfrac`), a leading sign, surrounding `$`, a trailing `%` or degree sign,
and a trailing `\\text{unit}`. Equal when |a - b| <= max(1e-6 * |b|, 1e-9). When the
reference is not a number (`\\sqrt{2}`, `x+1`), the texts are compared after removing
spaces and `$`, `\\left`, `\\right`, `\\!`, `\\,`. No eval, nothing unbounded: the text is
capped at 10 000 characters and a number at 400 digits.
"""

from __future__ import annotations

import re
from fractions import Fraction
from typing import Final

from sandbox_workers.verifiers.base import Verdict
from schemas.sandbox import Outcome, VerifierSpec

MAX_TEXT: Final = 10_000
MAX_DIGITS: Final = 400
REL_TOL: Final = Fraction(1, 10**6)
ABS_TOL: Final = Fraction(1, 10**9)
_NUMBER = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d{1,4})?")
_THOUSANDS = re.compile(r"[+-]?\d{1,3}(?:,\d{3})+(?:\.\d*)?")
_FRAC = re.compile(r"([+-]?)\\[dt]?frac\{([^{}]*)\}\{([^{}]*)\}")
_TEXT_UNIT = re.compile(r"\\(?:text|mathrm|mbox)\{[^{}]*\}$")


def final_answer(text: str) -> str:
    """The part of the candidate's text that is its final answer."""
    text = text[:MAX_TEXT]
    start = text.rfind("\\boxed{")
    if start >= 0:
        i, depth = start + len("\\boxed{"), 1
        for j in range(i, len(text)):
            depth += {"{": 1, "}": -1}.get(text[j], 0)
            if depth == 0:
                return text[i:j].strip()
        return text[i:].strip()
    if "####" in text:
        return text.rsplit("####", 1)[1].strip()
    return text.strip()


def _tidy(s: str) -> str:
    s = s.strip().strip("$").strip()
    for token in ("\\left", "\\right", "\\!", "\\,", "\\;", "\\ ", "{,}"):
        s = s.replace(token, "" if token != "{,}" else ",")
    s = _TEXT_UNIT.sub("", s).strip()
    for suffix in ("^\\circ", "^{\\circ}", "°", "\\%", "%", "."):
        s = s.removesuffix(suffix).strip()
    return s


def _plain_number(s: str) -> Fraction | None:
    if _THOUSANDS.fullmatch(s):
        s = s.replace(",", "")
    if not _NUMBER.fullmatch(s) or sum(ch.isdigit() for ch in s) > MAX_DIGITS:
        return None
    return Fraction(s)  # exact; the exponent is at most 4 digits (bounded by the regex)


def parse_number(text: str) -> Fraction | None:
    """An exact rational from an answer, or None when it is not a plain number."""
    s = _tidy(text)
    frac = _FRAC.fullmatch(s)
    if frac:
        num, den = _plain_number(frac.group(2).strip()), _plain_number(frac.group(3).strip())
        if num is None or den is None or den == 0:
            return None
        value = num / den
        return -value if frac.group(1) == "-" else value
    if s.count("/") == 1:
        a, b = (_plain_number(part.strip()) for part in s.split("/"))
        return None if a is None or b is None or b == 0 else a / b
    return _plain_number(s)


def _symbolic(text: str) -> str:
    return re.sub(r"\s+", "", _tidy(text))


class MathAnswer:
    name = "math_answer"
    version = "1.0"

    def problem(self, spec: VerifierSpec) -> str | None:
        return None if spec.answer and spec.answer.strip() else "no reference answer"

    async def judge(self, answer: str, spec: VerifierSpec) -> Verdict:
        return self.judge_sync(answer, spec.answer or "")

    def judge_sync(self, answer: str, reference: str) -> Verdict:
        got_text, want_text = final_answer(answer), final_answer(reference)
        want = parse_number(want_text)
        if want is None:
            ok = _symbolic(got_text) == _symbolic(want_text) and bool(_symbolic(want_text))
            detail = "" if ok else f"expected {want_text[:80]!r}, got {got_text[:80]!r}"
            return Verdict(Outcome.PASSED if ok else Outcome.FAILED, int(ok), 1, detail)
        got = parse_number(got_text)
        if got is None:
            return Verdict(Outcome.FAILED, 0, 1, f"no number in the answer {got_text[:80]!r}")
        ok = abs(got - want) <= max(REL_TOL * abs(want), ABS_TOL)
        detail = "" if ok else f"expected {want_text[:80]}, got {got_text[:80]}"
        return Verdict(Outcome.PASSED if ok else Outcome.FAILED, int(ok), 1, detail)
