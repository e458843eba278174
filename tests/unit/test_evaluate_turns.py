"""Two-turn evaluation (services/rollout/evaluate_turns.py) with a scripted policy and a
scripted sandbox: which tasks get a second turn, what its context holds, how it is
scored."""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass
from typing import Any

import pytest

from schemas.rollout import Task
from schemas.sandbox import Outcome, SandboxResult, VerifierSpec
from services.rollout import evaluate_turns
from services.rollout.evaluate_turns import evaluate_two_turns, needs_second_turn, tally
from services.settings import load
from tests.unit.test_generator_episodes import Codec  # the byte codec of the episode tests

HIDDEN_VALUE = "HIDDEN-EXPECTED-9137"


def spec(task_id: str, public: bool = True) -> VerifierSpec:
    hidden = (
        f"from solution import f\n\ndef test_0():\n    assert f() == '{HIDDEN_VALUE}{task_id}'\n"
    )
    shown = "from solution import f\n\ndef test_0():\n    assert f() is not None\n"
    return VerifierSpec(name="python_tests", tests=hidden, feedback_tests=shown if public else None)


def task(task_id: str, public: bool = True) -> Task:
    return Task(task_id=task_id, suite="code", prompt=f"write f for {task_id}\n",
                verifier=spec(task_id, public), group_size=1)  # fmt: skip


@dataclass
class Drawn:
    tokens: list[int]
    finish_reason: str = "stop"


class ScriptedPolicy:
    """No `model`: the batched decoder calls `sample` per prompt. The answer depends on
    whether the context already holds an observation (a second turn)."""

    def __init__(self, answers: dict[str, tuple[str, str]]) -> None:
        self.answers = answers
        self.contexts: list[str] = []

    def sample(self, prompt: list[int], n: int, **kw: Any) -> list[Drawn]:
        text = bytes(prompt).decode()
        self.contexts.append(text)
        task_id = text.split("write f for ")[1].split("\n")[0]
        first, second = self.answers[task_id]
        answer = second if "# sandbox:" in text else first
        return [Drawn(list(answer.encode())) for _ in range(n)]


class ScriptedSandbox:
    """Verdicts by (task, which tests, code): public tests pass for code containing
    'public-ok', hidden ones for 'hidden-ok'."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, bool, str]] = []

    async def __call__(self, task: Task, s: VerifierSpec, completion: str) -> SandboxResult:
        hidden = s.tests == task.verifier.tests
        self.calls.append((task.task_id, hidden, completion))
        ok = ("hidden-ok" if hidden else "public-ok") in completion
        return SandboxResult(
            request_id="r", trajectory_id="r", group_id="r", outcome=Outcome.PASSED if ok
            else Outcome.FAILED, passed=int(ok), total=1, detail="" if ok else "test_0 failed",
        )  # fmt: skip


def run(tasks: list[Task], answers: dict[str, tuple[str, str]]) -> tuple[Any, Any, Any]:
    policy, sandbox = ScriptedPolicy(answers), ScriptedSandbox()
    settings = load(["generator.max_new_tokens=32"])
    result = asyncio.run(evaluate_two_turns(policy, Codec(), tasks, sandbox, settings))
    return result, policy, sandbox


def test_second_turns_only_after_a_public_failure_and_scored_on_hidden_tests() -> None:
    tasks = [task("a"), task("b"), task("c"), task("d", public=False)]
    answers = {
        "a": ("public-ok hidden-ok", "unused"),  # passes at once: no second turn
        "b": ("wrong", "public-ok hidden-ok"),  # fixed by its second turn
        "c": ("hidden-ok", "still wrong"),  # public fails, hidden passed: broken
        "d": ("wrong", "unused"),  # no public tests: no second turn
    }
    result, policy, sandbox = run(tasks, answers)
    assert result.tasks == 4
    assert result.second_turns == 2
    assert (result.fixed, result.broken) == (1, 1)
    assert result.first_pass == pytest.approx(2 / 4)
    assert result.final_pass == pytest.approx(2 / 4)
    assert result.ratio == pytest.approx(1.0)
    seconds = [c for c in policy.contexts if "# sandbox:" in c]
    assert len(seconds) == 2
    # the second turn continues prompt + first turn + the public verdict
    assert any(c.startswith("write f for b\nwrong\n# sandbox: failed: 0/1") for c in seconds)
    # the final verdicts are hidden-test runs of the second turn's text alone
    assert ("b", True, "public-ok hidden-ok") in sandbox.calls
    assert ("c", True, "still wrong") in sandbox.calls


def test_no_hidden_test_text_reaches_a_second_turn() -> None:
    tasks = [task(f"t{i}") for i in range(3)]
    result, policy, _ = run(tasks, {f"t{i}": ("wrong", "wrong again") for i in range(3)})
    assert result.second_turns == 3
    assert all(HIDDEN_VALUE not in c for c in policy.contexts)


def test_tally_and_gate() -> None:
    r = tally("code", [False, False], [True, False], [0])
    assert (r.first_pass, r.final_pass, r.fixed, r.broken) == (0.0, 0.5, 1, 0)
    assert math.isnan(r.ratio)
    assert not needs_second_turn(None)
    passed = SandboxResult(request_id="r", trajectory_id="r", group_id="r", outcome=Outcome.PASSED)
    assert not needs_second_turn(passed)
    assert evaluate_turns.needs_second_turn(
        SandboxResult(request_id="r", trajectory_id="r", group_id="r", outcome=Outcome.TIMEOUT)
    )
