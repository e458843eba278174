"""exact and regex: the candidate's answer text (the request's `code`) against the spec.

exact: equal after removing leading and trailing whitespace (nothing else is normalised:
case and inner whitespace count).
regex: the answer, leading and trailing whitespace removed, must match `pattern` as a
whole (re.fullmatch). Python's `re` backtracks, so a pattern and an answer can take
exponential time: the match runs in a helper process (regex_guard.py) that is killed
after `timeout_s`; that outcome is timeout. An invalid pattern is the task's error
(sandbox_error).
"""

from __future__ import annotations

from typing import Final

from sandbox_workers.regex_guard import RegexGuard
from sandbox_workers.verifiers.base import Verdict
from schemas.sandbox import Outcome, VerifierSpec

MAX_ANSWER: Final = 64 * 1024


class Exact:
    name = "exact"
    version = "1.0"

    def problem(self, spec: VerifierSpec) -> str | None:
        return None if spec.answer is not None else "no reference answer"

    async def judge(self, answer: str, spec: VerifierSpec) -> Verdict:
        ok = answer.strip() == (spec.answer or "").strip()
        detail = "" if ok else f"expected {spec.answer!r:.80}, got {answer.strip()!r:.80}"
        return Verdict(Outcome.PASSED if ok else Outcome.FAILED, int(ok), 1, detail)


class Regex:
    name = "regex"
    version = "1.0"

    def __init__(self, guard: RegexGuard | None = None, timeout_s: float = 1.0) -> None:
        self.guard = guard or RegexGuard()
        self.timeout_s = timeout_s

    def problem(self, spec: VerifierSpec) -> str | None:
        return None if spec.pattern else "no pattern"

    async def judge(self, answer: str, spec: VerifierSpec) -> Verdict:
        text = answer.strip()
        if len(text) > MAX_ANSWER:
            return Verdict(Outcome.FAILED, 0, 1, f"answer longer than {MAX_ANSWER} characters")
        try:
            matched = await self.guard.fullmatch(spec.pattern or "", text, self.timeout_s)
        except TimeoutError:
            return Verdict(Outcome.TIMEOUT, 0, 1, f"matching took over {self.timeout_s}s")
        except ValueError as exc:
            return Verdict(Outcome.SANDBOX_ERROR, 0, 0, f"task error: {exc}")
        detail = "" if matched else f"{text[:80]!r} does not match {spec.pattern!r:.80}"
        return Verdict(Outcome.PASSED if matched else Outcome.FAILED, int(matched), 1, detail)
