"""The Episode protocol: which environment runs a task, and the built-in ones (single turn,
multi-turn with the sandbox, tool calling) run with a scripted sampler."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from typing import Any

import msgspec
import pytest

from schemas.arrays import unpack_i32
from schemas.rollout import Task, Trajectory
from schemas.sandbox import Outcome, SandboxRequest, SandboxResult, VerifierSpec
from services.rollout import episode, episodes, toolcall
from services.rollout.episodes import Episodes, SingleTurn
from services.rollout.multiturn import MultiTurn
from services.rollout.toolcall import ToolCalling
from services.settings import load

EXACT = VerifierSpec(name="exact", answer="14", needs_sandbox=False)
SANDBOXED = VerifierSpec(
    name="python_tests",
    tests="from solution import f\n",
    feedback_tests="from solution import f\n\ndef test_0():\n    assert f() is None\n",
)


def task(**kw: Any) -> Task:
    base: dict[str, Any] = {
        "task_id": "t1", "suite": "s", "prompt": "compute", "verifier": EXACT, "group_size": 2
    }  # fmt: skip
    return Task(**{**base, **kw})


class Codec:
    def prompt_ids(self, task: Task) -> list[int]:
        return self.ids(task.prompt or "")

    def ids(self, text: str) -> list[int]:
        return list(text.encode())

    def text(self, ids: Sequence[int]) -> str:
        return bytes(ids).decode()


class ScriptedSampler:
    """Answers each call with the next scripted text (every one of `n` the same)."""

    def __init__(self, texts: list[str], max_seq_len: int = 4096) -> None:
        self.texts = list(texts)
        self.contexts: list[list[int]] = []
        self._max = max_seq_len

    @property
    def max_seq_len(self) -> int:
        return self._max

    async def turns(
        self, context: list[int], n: int, stop: Sequence[str] = ()
    ) -> list[episode.Turn]:
        self.contexts.append(list(context))
        text = self.texts.pop(0)
        ids = list(text.encode())
        return [episode.Turn(ids, [-0.1] * len(ids), 3, text, "stop") for _ in range(n)]


def context(sampler: ScriptedSampler, *overrides: str) -> episode.Context:
    settings = load(list(overrides))
    return episode.Context(settings, sampler, Codec(), "gen-1", producer=None, claim=None)  # type: ignore[arg-type]


def test_selection_follows_the_task() -> None:
    assert episodes.kinds()[-3:] == [ToolCalling, MultiTurn, SingleTurn]
    chooser = Episodes(context(ScriptedSampler([])))
    assert isinstance(chooser.for_task(task()), SingleTurn)
    assert isinstance(chooser.for_task(task(max_turns=3, verifier=SANDBOXED)), MultiTurn)
    assert isinstance(chooser.for_task(task(max_turns=1, verifier=SANDBOXED)), SingleTurn)
    tools = task(max_turns=3, metadata={"tools": "calculator"})
    assert isinstance(chooser.for_task(tools), ToolCalling)
    assert chooser.for_task(tools) is chooser.for_task(tools)  # built once


def test_a_registered_environment_is_tried_first() -> None:
    class Echo:
        def __init__(self, ctx: episode.Context) -> None:
            self.ctx = ctx

        @classmethod
        def accepts(cls, task: Task) -> bool:
            return task.suite == "echo"

        async def group(self, task: Task, group_id: str) -> list[Trajectory]:
            turn = episode.Turn([1], [0.0], 0, "echo", "stop")
            ids = self.ctx.codec.prompt_ids(task)
            return [self.ctx.trajectory(task, group_id, i, ids, [turn]) for i in range(2)]

        async def close(self) -> None:
            return None

    try:
        assert episodes.register(Echo) is Echo
        chooser = Episodes(context(ScriptedSampler([])))
        assert isinstance(chooser.for_task(task(suite="echo")), Echo)
        assert isinstance(chooser.for_task(task()), SingleTurn)
        group = asyncio.run(chooser.for_task(task(suite="echo")).group(task(suite="echo"), "g"))
        assert [t.completion for t in group] == ["echo", "echo"]
    finally:
        episodes._registered.remove(Echo)


def test_single_turn_samples_the_group_in_one_call() -> None:
    sampler = ScriptedSampler(["14"])
    group = asyncio.run(SingleTurn(context(sampler)).group(task(group_size=3), "g1"))
    assert len(sampler.contexts) == 1
    assert [t.index for t in group] == [0, 1, 2]
    assert {t.group_id for t in group} == {"g1"}
    assert all(t.completion == "14" and t.turns == 1 and t.policy_version == 3 for t in group)
    assert all(t.completion_mask is None for t in group)


def test_calculator_is_arithmetic_only() -> None:
    assert toolcall.calculator({"expression": "2 * (3 + 4)"}) == "14"
    assert toolcall.calculator({"expression": "7 / 2"}) == "3.5"
    for bad in ("__import__('os')", "a + 1", "1 / 0", "2 ** 1000", "9 ** 9 ** 9"):
        with pytest.raises(ValueError):
            toolcall.calculator({"expression": bad})


def test_parse_calls() -> None:
    text = 'ok <tool_call>{"name": "calculator", "arguments": {"expression": "1+2"}}</tool_call>'
    (call,) = toolcall.parse_calls(text, "c")  # type: ignore[misc]
    assert call.id == "c-0" and call.function.name == "calculator"
    assert json.loads(call.function.arguments) == {"expression": "1+2"}
    assert toolcall.parse_calls("no call here", "c") == []
    assert "malformed" in str(toolcall.parse_calls("<tool_call>{oops</tool_call>", "c"))
    unknown = toolcall.parse_calls('<tool_call>{"name": "rm"}</tool_call>', "c")
    assert isinstance(unknown, list)
    assert "unknown tool" in toolcall.run_call(unknown[0], toolcall.TOOLS)


def test_tool_calling_episode_runs_the_tool_and_records_the_chat() -> None:
    call = '<tool_call>{"name": "calculator", "arguments": {"expression": "2*7"}}</tool_call>'
    sampler = ScriptedSampler([call, "the answer is 14"])
    t = task(group_size=1, max_turns=3, metadata={"tools": "calculator"})
    (traj,) = asyncio.run(ToolCalling(context(sampler)).group(t, "g"))
    assert traj.finish_reason == "stop" and traj.turns == 2
    assert traj.completion == "the answer is 14"
    roles = [m.role for m in traj.messages]
    assert roles == ["user", "assistant", "tool", "assistant"]
    assistant, tool = traj.messages[1], traj.messages[2]
    assert assistant.tool_calls[0].function.name == "calculator"
    assert tool.tool_call_id == assistant.tool_calls[0].id
    assert tool.content is not None and "14" in tool.content
    # the second turn saw the tool's result; its tokens are masked out of training
    assert "<tool_response>\n14\n</tool_response>" in bytes(sampler.contexts[1]).decode()
    mask = traj.completion_mask
    assert mask is not None and 0 in mask and 1 in mask
    assert len(mask) == len(unpack_i32(traj.completion_tokens))


def test_tool_calling_budget_and_bad_calls() -> None:
    call = '<tool_call>{"name": "calculator", "arguments": {"expression": "1"}}</tool_call>'
    sampler = ScriptedSampler(["<tool_call>{bad</tool_call>", call])
    t = task(group_size=1, max_turns=2, metadata={"tools": "calculator"})
    (traj,) = asyncio.run(ToolCalling(context(sampler)).group(t, "g"))
    assert traj.finish_reason == "turn_limit" and traj.turns == 2
    assert traj.messages[2].role == "user" and "malformed" in (traj.messages[2].content or "")


class FakeSandbox:
    def __init__(self, outcomes: list[Outcome | None]) -> None:
        self.outcomes = outcomes
        self.requests: list[SandboxRequest] = []

    async def run(self, request: SandboxRequest, timeout_s: float) -> SandboxResult | None:
        self.requests.append(request)
        outcome = self.outcomes.pop(0)
        if outcome is None:
            return None
        return SandboxResult(
            request_id=request.request_id, trajectory_id=request.trajectory_id,
            group_id=request.group_id, task_id=request.task_id, outcome=outcome,
            passed=0, total=1,
        )  # fmt: skip

    async def stop(self) -> None:
        return None


def test_multi_turn_episode_through_a_sandbox() -> None:
    sampler = ScriptedSampler(["```python\ndef f(): pass\n```", "```python\ndef f(): 1\n```"])
    env = MultiTurn(context(sampler))
    sandbox = FakeSandbox([Outcome.FAILED, Outcome.PASSED])
    env.client = sandbox  # type: ignore[assignment]
    t = task(group_size=1, max_turns=3, verifier=SANDBOXED)
    (traj,) = asyncio.run(env.group(t, "g"))
    assert traj.finish_reason == "stop" and traj.turns == 2
    assert [r.turn for r in sandbox.requests] == [0, 1]
    assert [m.role for m in traj.messages] == ["user", "assistant", "user", "assistant"]
    assert traj.completion_mask is not None and 0 in traj.completion_mask


def test_multi_turn_observations_run_only_the_public_tests() -> None:
    hidden = "from solution import f\n\ndef test_hidden():\n    assert f() == 424242\n"
    public = "from solution import f\n\ndef test_public():\n    assert f() is not None\n"
    spec = VerifierSpec(name="python_tests", tests=hidden, feedback_tests=public)
    sampler = ScriptedSampler(["```python\ndef f(): pass\n```", "```python\ndef f(): 1\n```"])
    env = MultiTurn(context(sampler))
    sandbox = FakeSandbox([Outcome.FAILED, Outcome.PASSED])
    env.client = sandbox  # type: ignore[assignment]
    (traj,) = asyncio.run(env.group(task(group_size=1, max_turns=3, verifier=spec), "g"))
    assert sandbox.requests, "feedback runs went through the sandbox"
    for request in sandbox.requests:
        assert request.verifier.tests == public
        assert "424242" not in (request.verifier.tests or "")
        assert not request.verifier.feedback_tests
    assert all("424242" not in (m.content or "") for m in traj.messages)


def test_no_hidden_test_reaches_a_prompt_or_an_observation() -> None:
    hidden = "assert f(41) == 'HIDDEN-EXPECTED-9731'"
    spec = VerifierSpec(
        name="python_tests",
        tests=f"from solution import f\n\ndef test_0():\n    {hidden}\n",
        feedback_tests="from solution import f\n\ndef test_0():\n    assert f(1) == 2\n",
    )

    class Echoing(FakeSandbox):
        """A sandbox whose verdict quotes the tests it ran (like a failed assert would)."""

        async def run(self, request: SandboxRequest, timeout_s: float) -> SandboxResult | None:
            result = await super().run(request, timeout_s)
            assert result is not None
            return msgspec.structs.replace(result, detail=request.verifier.tests or "")

    sampler = ScriptedSampler(["```python\ndef f(x): 0\n```"] * 3)
    env = MultiTurn(context(sampler))
    sandbox = Echoing([Outcome.FAILED, Outcome.FAILED])
    env.client = sandbox  # type: ignore[assignment]
    (traj,) = asyncio.run(env.group(task(group_size=1, max_turns=3, verifier=spec), "g"))
    assert traj.turns == 3 and len(sandbox.requests) == 2
    assert all(r.verifier.tests == spec.feedback_tests for r in sandbox.requests)
    seen = [bytes(c).decode() for c in sampler.contexts] + [m.content or "" for m in traj.messages]
    assert any("assert f(1) == 2" in text for text in seen)  # public failures are shown
    assert not any("HIDDEN-EXPECTED-9731" in text or "f(41)" in text for text in seen)
    assert traj.verifier == spec  # the dispatcher still scores with the hidden tests


def test_without_public_tests_there_is_no_feedback_run() -> None:
    sampler = ScriptedSampler(["```python\ndef f(): 0\n```", "unused"])
    env = MultiTurn(context(sampler))
    env.client = FakeSandbox([])  # type: ignore[assignment]
    bare = VerifierSpec(name="python_tests", tests="from solution import f\n")
    (traj,) = asyncio.run(env.group(task(group_size=1, max_turns=3, verifier=bare), "g"))
    assert traj.turns == 1 and env.client.requests == []  # type: ignore[attr-defined]
    assert traj.finish_reason == "stop"


def test_multi_turn_timeout_ends_the_episode() -> None:
    sampler = ScriptedSampler(["a", "b"])
    env = MultiTurn(context(sampler))
    env.client = FakeSandbox([None])  # type: ignore[assignment]
    (traj,) = asyncio.run(env.group(task(group_size=1, max_turns=3, verifier=SANDBOXED), "g"))
    assert traj.finish_reason == "turn_timeout" and traj.turns == 1


def test_the_readme_example_is_a_working_environment() -> None:
    import re
    from pathlib import Path

    readme = (Path(__file__).parents[2] / "README.md").read_text()
    section = readme.split("## Adding an environment", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert code is not None
    namespace: dict[str, Any] = {"__name__": "my_envs"}
    before = list(episodes._registered)
    exec(compile(code.group(1), "README.md", "exec"), namespace)
    reflect = namespace["Reflect"]
    try:
        assert episodes.kinds()[0] is reflect
        sampler = ScriptedSampler(["13", "14"])
        chooser = Episodes(context(sampler))
        t = task(group_size=1, metadata={"env": "reflect"})
        env = chooser.for_task(t)
        assert isinstance(env, reflect)
        (traj,) = asyncio.run(env.group(t, "g"))
        assert traj.completion == "14" and traj.turns == 2
        assert traj.finish_reason == "turn_limit"
        assert "Check your answer" in bytes(sampler.contexts[1]).decode()
    finally:
        episodes._registered[:] = before
