"""`pyfunc`: write a one-line Python function from a short description, judged by
`python_tests` in the sandbox tier.

Prompt ``# python: f(x) returns x plus 3`` -> completion ``def f(x): return x+3``. Seven
operations x constants 1-19 (133 tasks); four tests per task, so a partly right function
earns partial credit (rewards.mode `fraction`). Held-out tasks are unseen operation and
constant pairs: the policy has to map the words to the operator and copy the constant.
"""

from __future__ import annotations

from collections.abc import Callable

from schemas.rollout import Task
from schemas.sandbox import VerifierSpec
from services.suites.base import Split, split_of

OPS: dict[str, tuple[str, str, Callable[[int, int], int]]] = {
    # name: (description with K, code with K, reference semantics)
    "add": ("x plus K", "x+K", lambda x, k: x + k),
    "sub": ("x minus K", "x-K", lambda x, k: x - k),
    "mul": ("x times K", "x*K", lambda x, k: x * k),
    "mod": ("x modulo K", "x%K", lambda x, k: x % k),
    "div": ("x floor-divided by K", "x//K", lambda x, k: x // k),
    "max": ("the larger of x and K", "max(x,K)", lambda x, k: max(x, k)),
    "min": ("the smaller of x and K", "min(x,K)", lambda x, k: min(x, k)),
}
CONSTANTS = range(1, 20)
INPUTS = (0, 7, 12, 25)


def _tests(fn: Callable[[int, int], int], k: int) -> str:
    lines = ["from solution import f", ""]
    for i, x in enumerate(INPUTS):
        lines += ["", f"def test_{i}():", f"    assert f({x}) == {fn(x, k)}", ""]
    return "\n".join(lines)


class PyFunc:
    name = "pyfunc"

    def __init__(self, group_size: int = 8, max_turns: int = 1) -> None:
        self.group_size = group_size
        self.max_turns = max_turns
        self._all = [self._task(op, k) for op in OPS for k in CONSTANTS]

    def _task(self, op: str, k: int) -> Task:
        words, code, fn = OPS[op]
        task_id = f"pyfunc/{op}/{k}"
        reference = f"def f(x): return {code.replace('K', str(k))}"
        return Task(
            task_id=task_id,
            suite=self.name,
            prompt=f"# python: f(x) returns {words.replace('K', str(k))}\n",
            verifier=VerifierSpec(name="python_tests", tests=_tests(fn, k)),
            group_size=self.group_size,
            max_turns=self.max_turns,
            metadata={"split": split_of(task_id), "op": op},
            reference=reference,
        )

    def tasks(self, split: Split) -> list[Task]:
        return [t for t in self._all if t.metadata["split"] == split]

    def example(self, task: Task) -> str:
        return task.reference or ""
