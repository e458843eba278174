"""Tool-calling episodes (DESIGN.md section 7): the policy calls tools by writing
`<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks (the Hermes / Qwen chat
format); each call is run here and its result inserted as a `tool` message,
`<tool_response>...</tool_response>`, before the next turn. A turn without a call ends the
episode (finish_reason `stop`); the budget is the task's `max_turns` (capped by
generator.max_turns).

A task asks for tools by name in its metadata, comma-separated: `metadata["tools"] =
"calculator"` (the prompt describes them to the policy). The trajectory's messages carry
the calls as `ChatMessage.tool_calls` and the results as role `tool` with
`tool_call_id`, in the OpenAI chat format. Tools run in the generator's process: a tool is
a small pure function of its JSON arguments, never the policy's code (that goes to the
sandbox tier).
"""

from __future__ import annotations

import ast
import asyncio
import json
import operator
import re
from collections.abc import Callable
from typing import Any, Final

from schemas.chat import FunctionCall, ToolCall
from schemas.envelope import new_id
from schemas.rollout import Task, Trajectory
from services.rollout import episode

Tool = Callable[[dict[str, Any]], str]
"""A tool: its JSON arguments in, its result as text out (raise ValueError on bad input)."""

CALL: Final = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)

_OPS: Final[dict[type, Callable[..., Any]]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
    ast.USub: operator.neg,
    ast.UAdd: operator.pos,
}


def _arith(node: ast.AST) -> Any:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        left, right = _arith(node.left), _arith(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > 64:
            raise ValueError("exponent too large")
        value = _OPS[type(node.op)](left, right)
        if isinstance(value, int) and value.bit_length() > 1024:
            raise ValueError("result too large")
        return value
    if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_arith(node.operand))
    raise ValueError(f"not arithmetic: {ast.dump(node)[:60]}")


def calculator(arguments: dict[str, Any]) -> str:
    """`{"expression": "2 * (3 + 4)"}` -> "14": numbers and + - * / // % ** only."""
    expression = str(arguments.get("expression", ""))
    if len(expression) > 200:
        raise ValueError("expression longer than 200 characters")
    try:
        tree = ast.parse(expression, mode="eval")
        return str(_arith(tree.body))
    except (SyntaxError, ZeroDivisionError, OverflowError) as exc:
        raise ValueError(f"{type(exc).__name__}: {exc}") from exc


TOOLS: dict[str, Tool] = {"calculator": calculator}
"""Tools by name; add one with `TOOLS["name"] = function`."""


def parse_calls(text: str, call_id: str) -> list[ToolCall] | str:
    """The tool calls a turn wrote (ids `{call_id}-{i}`), or why one is malformed."""
    calls = []
    for i, block in enumerate(CALL.findall(text)):
        try:
            obj = json.loads(block)
            name, arguments = obj["name"], obj.get("arguments", {})
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            return f"malformed tool call {i}: {type(exc).__name__}: {exc}"
        if not isinstance(name, str) or not isinstance(arguments, dict):
            return f"malformed tool call {i}: name must be a string, arguments an object"
        function = FunctionCall(name=name, arguments=json.dumps(arguments))
        calls.append(ToolCall(id=f"{call_id}-{i}", function=function))
    return calls


def run_call(call: ToolCall, allowed: dict[str, Tool]) -> str:
    """The result of one call, or the error the policy is shown."""
    tool = allowed.get(call.function.name)
    if tool is None:
        return f"error: unknown tool {call.function.name!r} (have: {', '.join(allowed)})"
    try:
        return tool(json.loads(call.function.arguments or "{}"))
    except (ValueError, TypeError) as exc:
        return f"error: {exc}"


class ToolCalling:
    def __init__(self, ctx: episode.Context) -> None:
        self.ctx = ctx
        self.cfg = ctx.settings.generator

    @classmethod
    def accepts(cls, task: Task) -> bool:
        return bool(task.metadata.get("tools", "").strip())

    async def close(self) -> None:
        return None

    async def group(self, task: Task, group_id: str) -> list[Trajectory]:
        names = [n.strip() for n in task.metadata.get("tools", "").split(",") if n.strip()]
        allowed = {n: TOOLS[n] for n in names if n in TOOLS}
        prompt_ids = self.ctx.codec.prompt_ids(task)
        turns = min(task.max_turns, self.cfg.max_turns)

        async def one(index: int) -> Trajectory:
            traj_id = new_id()
            step = self._step(traj_id, allowed)
            parts, reason = await episode.turn_loop(self.ctx, prompt_ids, turns, step)
            return self.ctx.trajectory(task, group_id, index, prompt_ids, parts, reason, traj_id)

        return list(await asyncio.gather(*(one(i) for i in range(task.group_size))))

    def _step(self, traj_id: str, allowed: dict[str, Tool]) -> episode.Step:
        limit = self.cfg.observation_chars

        async def step(t: int, turn: episode.Turn) -> tuple[list[episode.Observation], str | None]:
            calls = parse_calls(turn.text, f"{traj_id}-{t}")
            if isinstance(calls, str):
                text = f"\n# tool: {calls[:limit]}\n"
                return [episode.Observation(self.ctx.codec.ids(text), text)], None
            if not calls:
                return [], "stop"
            turn.tool_calls = calls
            observations = []
            for call in calls:
                text = f"\n<tool_response>\n{run_call(call, allowed)[:limit]}\n</tool_response>\n"
                obs = episode.Observation(self.ctx.codec.ids(text), text, "tool", call.id)
                observations.append(obs)
            return observations, None

        return step
