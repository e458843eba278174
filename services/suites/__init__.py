"""Built-in task suites: small problems whose verifiers really run, sized so the built-in
tiny policy learns them on a laptop CPU.

- `arith`: `a+b=` with a < 100 and b < 10; judged by `math_answer` in-process.
- `pyfunc`: write a one-line Python function `f(x)` from a short description; judged by
  `python_tests` in the sandbox tier (partial credit: the fraction of tests passed).

Every suite splits its tasks deterministically (a hash of the task id) into `train` (fed
to the generators), `warmup` (the supervised examples of the demo's initial policy) and
`heldout` (never fed; the demo evaluates on it before and after training), unless its
data fixes the splits (`code`, `humaneval`). An evaluation-only suite (EVAL_ONLY) has no
`train` split and the feeder refuses it.
"""

from __future__ import annotations

from services.suites.base import SPLITS, Split, Suite, split_of

__all__ = ["EVAL_ONLY", "SPLITS", "Split", "Suite", "get", "is_eval_only", "names", "split_of"]

EVAL_ONLY = frozenset({"humaneval"})
"""Built-in suites that are never trained on (their `eval_only` attribute is True)."""


def names() -> list[str]:
    """Names of the built-in suites."""
    return ["arith", "pyfunc", "code", "humaneval"]


def is_eval_only(name: str) -> bool:
    """True for a built-in suite that must never be fed to training."""
    return name in EVAL_ONLY


def get(name: str, *, group_size: int = 8, max_turns: int = 1) -> Suite:
    """A built-in suite by name (KeyError with the known names otherwise)."""
    if name == "arith":
        from services.suites.arith import Arith

        return Arith(group_size=group_size)
    if name == "pyfunc":
        from services.suites.pyfunc import PyFunc

        return PyFunc(group_size=group_size, max_turns=max_turns)
    if name == "code":
        from services.suites.code import Code

        return Code(group_size=group_size, max_turns=max_turns)
    if name == "humaneval":
        from services.suites.humaneval import HumanEval

        return HumanEval(group_size=group_size, max_turns=max_turns)
    raise KeyError(f"unknown suite {name!r} (built-in: {', '.join(names())})")
