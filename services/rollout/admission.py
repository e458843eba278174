"""Task admission, pure: parse task-file lines and find what makes a task unusable.

A task file is JSONL: one JSON object per line with the fields of `schemas.rollout.Task`
(`task_id`, `suite`, `prompt` or `messages`, `verifier`, optional `group_size`,
`max_turns`, `metadata`, `reference`). Blank lines and lines starting with `#` are
skipped. `verifier.needs_sandbox` may be left out: it follows from the verifier. Example::

    {"task_id": "sq/3", "suite": "mine", "prompt": "3*3=",
     "verifier": {"name": "math_answer", "answer": "9"}, "reference": "9"}

A `python_tests` verifier may carry `feedback_tests` (public example tests, same file
format as `tests`, shown in the prompt and run for multi-turn feedback; never scored);
another verifier with `feedback_tests` is rejected.

A task is admitted when it parses, its verifier is deployed and its spec usable, and its
reference solution (when given) passes its own verifier. The last check needs a verifier
run (services/rollout/feeder.py does it in-process or through the sandbox tier); its
verdict is judged here. Rejections carry a reason a person can act on.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import msgspec

from sandbox_workers.verifiers import InProcessVerifier, Registry, Verifier
from schemas.rollout import Task
from schemas.sandbox import Outcome

MAX_PROMPT_CHARS = 100_000


class Rejected(ValueError):
    """A task that cannot be admitted, with the reason."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def task_lines(text: str) -> Iterator[tuple[int, str]]:
    """(line number from 1, line) of the lines that hold a task."""
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if stripped and not stripped.startswith("#"):
            yield number, stripped


def parse_line(line: str, *, group_size: int, registry: Registry) -> Task:
    """One task-file line as an admissible-so-far Task (defaults filled in, verifier
    checked; the reference is checked later). Raises Rejected."""
    try:
        data = json.loads(line)
    except ValueError as exc:
        raise Rejected(f"not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise Rejected(f"expected a JSON object, got {type(data).__name__}")
    data.pop("schema", None)
    data.setdefault("group_size", group_size)
    verifier = data.get("verifier")
    sandbox_given = isinstance(verifier, dict) and "needs_sandbox" in verifier
    try:
        task = msgspec.convert(data, Task)
    except (msgspec.ValidationError, ValueError) as exc:
        raise Rejected(f"not a valid Task: {exc}") from None
    plugin = verifier_of(task, registry)
    if not sandbox_given:
        task.verifier.needs_sandbox = not isinstance(plugin, InProcessVerifier)
    problem = static_problem(task, registry)
    if problem:
        raise Rejected(problem)
    return task


def verifier_of(task: Task, registry: Registry) -> Verifier:
    """The task's verifier plugin; Rejected when unknown, not deployed, or its spec unusable."""
    plugin, why = registry.lookup(task.verifier)
    if plugin is None:
        raise Rejected(why)
    return plugin


def static_problem(task: Task, registry: Registry) -> str | None:
    """What makes a task unusable before anything runs, or None."""
    try:
        plugin = verifier_of(task, registry)
    except Rejected as exc:
        return exc.reason
    in_process = isinstance(plugin, InProcessVerifier)
    if task.verifier.needs_sandbox == in_process:
        where = "in-process" if in_process else "in the sandbox"
        return (
            f"verifier {task.verifier.name} runs {where}, but needs_sandbox is "
            f"{task.verifier.needs_sandbox}: leave needs_sandbox out or set it to {not in_process}"
        )
    if task.verifier.feedback_tests is not None and task.verifier.name != "python_tests":
        return f"feedback_tests is for python_tests, not for {task.verifier.name}"
    text = prompt_text(task)
    if not text.strip():
        return "empty prompt"
    if len(text) > MAX_PROMPT_CHARS:
        return f"prompt of {len(text)} characters exceeds {MAX_PROMPT_CHARS}"
    if task.max_turns > 1 and in_process:
        return f"max_turns {task.max_turns} needs a sandboxed verifier (observations come from it)"
    return None


def prompt_text(task: Task) -> str:
    """The task's prompt as plain text (chat messages joined as `role: content` lines)."""
    if task.prompt is not None:
        return task.prompt
    return "".join(f"{m.role}: {m.content or ''}\n" for m in task.messages)


def reference_problem(outcome: Outcome, passed: int, total: int, detail: str) -> str | None:
    """Why a reference solution's verdict disqualifies its task, or None when it passed."""
    if outcome == Outcome.PASSED:
        return None
    what = f"{outcome.value} ({passed}/{total} passed)"
    return f"reference solution fails its own verifier: {what}{': ' + detail if detail else ''}"
