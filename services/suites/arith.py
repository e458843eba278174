"""`arith`: add a two-digit and a one-digit number (`57+8=` -> `65`), judged in-process by
`math_answer`. 1000 tasks. A tiny byte-level model has to learn the units table and the
carry; held-out tasks are new pairs of numbers it has never been trained on.

`Arith(max_a=N)` widens the first number to `a < N` (the pipeline benchmark's larger task
pool). The split of a task depends on its id alone, so the 1000 tasks of the default keep
their splits in every wider universe."""

from __future__ import annotations

from schemas.rollout import Task
from schemas.sandbox import VerifierSpec
from services.suites.base import Split, split_of

MAX_A = 100
MAX_B = 10


class Arith:
    name = "arith"

    def __init__(self, group_size: int = 8, max_a: int = MAX_A) -> None:
        if max_a < 1:
            raise ValueError(f"arith: max_a {max_a} must be at least 1")
        self.group_size = group_size
        self._all = [self._task(a, b) for a in range(max_a) for b in range(MAX_B)]

    def _task(self, a: int, b: int) -> Task:
        task_id = f"arith/{a}+{b}"
        answer = str(a + b)
        return Task(
            task_id=task_id,
            suite=self.name,
            prompt=f"{a}+{b}=",
            verifier=VerifierSpec(name="math_answer", answer=answer, needs_sandbox=False),
            group_size=self.group_size,
            metadata={"split": split_of(task_id), "op": "add"},
            reference=answer,
        )

    def tasks(self, split: Split) -> list[Task]:
        return [t for t in self._all if t.metadata["split"] == split]

    def example(self, task: Task) -> str:
        return task.reference or ""
