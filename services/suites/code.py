"""`code`: write a Python function from a short spec, judged by hidden tests in the sandbox.

MBPP-like tasks written for this project (services/suites/data/code_tasks.jsonl, one JSON
object a line): a spec in words, the required signature, two or three public example
asserts and at least four hidden asserts (edge cases included), and a reference
solution. The prompt shows the spec, the signature and the public examples and asks for
the function in a ```python fence; the verifier is `python_tests` whose `tests` (the
hidden asserts, one `test_*` function each: partial credit) decide the reward, while
`feedback_tests` (the public examples, same format) serve multi-turn feedback. No hidden
assert is ever shown.

Splits are fixed by the data: `train` (632 tasks) and `heldout` (317 distinct functions,
none of them a near-copy of a training function; never fed). `warmup` is empty. The
first 217 training tasks are mostly easy one-liners, 176 of them in 16 families of one
function with different constants; the 232 after them are distinct string, collection
and number functions (87 easy, 109 medium, 36 hard), so that most of what is trained on
is a function of its own at the small model's frontier rather than a constant to copy.
They were screened against the first 63 held-out tasks by name, spec and reference
similarity (near relatives such as an inverse of a held-out function were left out).
The last 298 lines (183 train, 115 held-out; 179 easy, 89 medium, 30 hard) are distinct
functions on strings, numbers and collections written in one batch, screened against
every earlier task and HumanEval; near relatives among them (the same idea with another
predicate, a function and its inverse) form clusters of one split, a relative of an
earlier task takes that task's split, and the other clusters were split at random (0.4
held-out), so the new held-out functions are drawn like the new training ones. The last
139 lines (held-out only: 69 easy, 46 medium, 24 hard) make the held-out estimate finer
(its binomial standard error falls with the square root of the count): 225 tasks written
in five themes (strings, lists, integers, collections and grids, small simulations and
parsing), checked by running each reference against its asserts and against wrong
solutions, screened by wording and then idea by idea against every earlier task,
HumanEval and each other; the 86 that were relatives of a training or HumanEval task (the
same idea with another constant or predicate, an inverse, a trivial composition) or of
another new task were left out. Every
task records `entry_point`, `split`, `difficulty` (easy | medium | hard) and, for a
family member, `family` in its metadata. The labels are the writer's: SmolLM2-135M-Instruct
passed 0.7% of 880 samples of the 232, "easy" ones included; its measured rates per
training task are in data/calibration-smollm2-code.json (services/suites/calibration.py),
which the demo feeds by.
"""

from __future__ import annotations

import functools
from importlib import resources

import msgspec

from schemas.rollout import Task
from schemas.sandbox import VerifierSpec
from services.suites.base import Split

DATA_FILE = "code_tasks.jsonl"
INSTRUCTION = "Answer with the function in a ```python code fence."


class CodeRecord(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """One line of the data file."""

    task_id: str
    split: Split
    difficulty: str
    entry_point: str
    signature: str
    spec: str
    examples: list[str]
    """Public asserts, shown in the prompt (`assert f(...) == ...`)."""
    hidden: list[str]
    """Hidden asserts, the scoring tests; never shown."""
    reference: str
    """A correct function (plain code, no fence)."""
    family: str = ""


@functools.cache
def records() -> tuple[CodeRecord, ...]:
    """Every task of the data file, in file order."""
    text = resources.files("services.suites").joinpath("data", DATA_FILE).read_text("utf-8")
    decoder = msgspec.json.Decoder(CodeRecord)
    return tuple(decoder.decode(line) for line in text.splitlines() if line.strip())


def tests_file(entry_point: str, asserts: list[str]) -> str:
    """A python_tests file: `from solution import NAME`, then one `test_*` per assert."""
    lines = [f"from solution import {entry_point}", ""]
    for i, statement in enumerate(asserts):
        lines += ["", f"def test_{i}():", f"    {statement}", ""]
    return "\n".join(lines)


def prompt_of(rec: CodeRecord) -> str:
    """The instruction the policy sees (plain text; the generator applies a chat template)."""
    examples = "\n".join(rec.examples)
    return (
        f"Write a Python function `{rec.entry_point}`. {rec.spec}\n\n"
        f"Signature:\n{rec.signature}\n\n"
        f"Examples:\n{examples}\n\n"
        f"{INSTRUCTION}\n"
    )


def fenced(code: str) -> str:
    """`code` as a completion in a ```python fence."""
    return f"```python\n{code.rstrip()}\n```"


class Code:
    name = "code"

    def __init__(self, group_size: int = 8, max_turns: int = 1) -> None:
        self.group_size = group_size
        self.max_turns = max_turns
        self._all = [self._task(r) for r in records()]

    def _task(self, rec: CodeRecord) -> Task:
        metadata = {"split": rec.split, "difficulty": rec.difficulty}
        metadata["entry_point"] = rec.entry_point
        if rec.family:
            metadata["family"] = rec.family
        verifier = VerifierSpec(
            name="python_tests",
            tests=tests_file(rec.entry_point, rec.hidden),
            feedback_tests=tests_file(rec.entry_point, rec.examples),
        )
        return Task(
            task_id=rec.task_id,
            suite=self.name,
            prompt=prompt_of(rec),
            verifier=verifier,
            group_size=self.group_size,
            max_turns=self.max_turns,
            metadata=metadata,
            reference=fenced(rec.reference),
        )

    def tasks(self, split: Split) -> list[Task]:
        return [t for t in self._all if t.metadata["split"] == split]

    def example(self, task: Task) -> str:
        return task.reference or ""
