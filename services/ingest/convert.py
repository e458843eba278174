"""From a validated request to a Trajectory (pure: no I/O).

Checks what the request models cannot say alone (the conversation's shape, tool call
references, token array lengths, the vocabulary) and reports every problem at once, each
as `location: why` a client can act on.

Tokenisation, when the client sends no token ids: the conversation is rendered with the
template below and encoded with the policy's tokenizer (services/ingest/tokenizer.py).
The prompt is every message before the first assistant message (with the tools, when
offered); the completion is the rest, where the assistant's own text and tool calls are
trained on (completion_mask 1) and everything else, headers and tool results, is not (0).

    <|tools|>\\n[...tools as JSON...]\\n      (only when tools are offered)
    <|role|>\\n  or  <|role name=NAME|>\\n   (each message's header)
    content\\n                               (text parts joined)
    <|tool_call|>{"id":..,"name":..,"arguments":..}\\n   (each tool call)
    EOS                                      (after each assistant turn, trained on)
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from schemas.arrays import pack_f32, pack_i32
from schemas.chat import ChatMessage, FunctionCall, ToolCall
from schemas.envelope import Origin, new_id
from schemas.rollout import Trajectory
from schemas.sandbox import IOCase, VerifierSpec
from services.ingest.models import MessageIn, TraceIn, VerifierIn

FEEDBACK_VERIFIER = "feedback"
"""Verifier name of traces judged by feedback (no verifier runs them; see feedback.py)."""
FEEDBACK_VERIFIER_VERSION = "1"
_SANDBOXED = frozenset({"python_tests", "stdin_stdout"})


class Invalid(ValueError):
    """A request that cannot become a trajectory; `problems` says why, field by field."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


class Tokenizer(Protocol):
    """What the gateway needs of the policy's tokenizer."""

    vocab_size: int
    bos_id: int | None
    eos_id: int | None

    def encode(self, text: str) -> list[int]:
        """Token ids of `text`, no special tokens added."""
        ...


@dataclass(frozen=True)
class Limits:
    max_messages: int
    max_tokens: int | None
    task_id: str


def text_of(msg: MessageIn) -> str | None:
    if msg.content is None or isinstance(msg.content, str):
        return msg.content
    return "".join(part.text for part in msg.content)


def check_conversation(messages: Sequence[MessageIn], limits: Limits) -> list[str]:
    """Problems with the conversation's shape (empty when it is usable)."""
    out: list[str] = []
    if len(messages) > limits.max_messages:
        out.append(f"messages: {len(messages)} messages, at most {limits.max_messages}")
    roles = [m.role for m in messages]
    if "assistant" not in roles:
        out.append("messages: no assistant message: a trace needs the agent's output")
    elif roles[0] == "assistant":
        out.append("messages[0]: the conversation must open with the prompt (system/user)")
    calls: set[str] = set()
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if m.role == "assistant":
            if text_of(m) is None and not m.tool_calls:
                out.append(f"{where}: an assistant message needs content or tool_calls")
            calls.update(c.id for c in m.tool_calls)
        elif m.tool_calls:
            out.append(f"{where}.tool_calls: only assistant messages call tools")
        if m.role == "tool":
            if m.tool_call_id is None:
                out.append(f"{where}.tool_call_id: required for role tool")
            elif m.tool_call_id not in calls:
                out.append(f"{where}.tool_call_id: {m.tool_call_id!r} answers no earlier call")
        elif m.tool_call_id is not None:
            out.append(f"{where}.tool_call_id: only tool messages answer a call")
    return out


def render(req: TraceIn, tok: Tokenizer) -> tuple[list[int], list[int], list[int]]:
    """(prompt ids, completion ids, completion mask) of the conversation (see module)."""
    prompt: list[int] = [] if tok.bos_id is None else [tok.bos_id]
    if req.tools:
        tools = [t.model_dump(mode="json") for t in req.tools]
        prompt += tok.encode("<|tools|>\n" + json.dumps(tools, separators=(",", ":")) + "\n")
    first = next(i for i, m in enumerate(req.messages) if m.role == "assistant")
    for m in req.messages[:first]:
        prompt += tok.encode(_header(m) + _body(m))
    completion: list[int] = []
    mask: list[int] = []
    for m in req.messages[first:]:
        head = tok.encode(_header(m))
        body = tok.encode(_body(m))
        trained = 1 if m.role == "assistant" else 0
        if trained and tok.eos_id is not None:
            body.append(tok.eos_id)
        completion += head + body
        mask += [0] * len(head) + [trained] * len(body)
    return prompt, completion, mask


def _header(m: MessageIn) -> str:
    return f"<|{m.role} name={m.name}|>\n" if m.name else f"<|{m.role}|>\n"


def _body(m: MessageIn) -> str:
    text = text_of(m)
    parts = [] if text is None else [text + "\n"]
    for c in m.tool_calls:
        call = {"id": c.id, "name": c.function.name, "arguments": c.function.arguments}
        parts.append("<|tool_call|>" + json.dumps(call, separators=(",", ":")) + "\n")
    return "".join(parts)


def _check_tokens(req: TraceIn, vocab_size: int | None) -> list[str]:
    out: list[str] = []
    prompt, completion = req.prompt_token_ids, req.completion_token_ids
    if (prompt is None) != (completion is None):
        return ["prompt_token_ids, completion_token_ids: send both, or neither"]
    if prompt is None or completion is None:
        if req.completion_mask is not None or req.logprobs is not None:
            out.append("completion_mask, logprobs: only with prompt/completion_token_ids")
        return out
    if not prompt:
        out.append("prompt_token_ids: empty (the first completion token needs context)")
    if not completion:
        out.append("completion_token_ids: empty (nothing to learn from)")
    n = len(completion)
    for name in ("completion_mask", "logprobs"):
        values = getattr(req, name)
        if values is not None and len(values) != n:
            out.append(f"{name}: {len(values)} values, expected {n} (one per completion token)")
    if req.completion_mask is not None and not any(req.completion_mask):
        out.append("completion_mask: all zero (no token was sampled by the agent)")
    if vocab_size is not None:
        bad = [t for t in (*prompt, *completion) if t >= vocab_size]
        if bad:
            out.append(f"token ids: {bad[0]} is outside the policy vocabulary [0, {vocab_size})")
    return out


def verifier_spec(v: VerifierIn | None) -> VerifierSpec:
    if v is None:
        return VerifierSpec(
            name=FEEDBACK_VERIFIER, version=FEEDBACK_VERIFIER_VERSION, needs_sandbox=False
        )
    needs = v.needs_sandbox if v.needs_sandbox is not None else v.name in _SANDBOXED
    return VerifierSpec(
        name=v.name,
        version=v.version,
        tests=v.tests,
        cases=[IOCase(stdin=c.stdin, stdout=c.stdout) for c in v.cases],
        answer=v.answer,
        pattern=v.pattern,
        needs_sandbox=needs,
    )


def verifier_problems(spec: VerifierSpec) -> list[str]:
    """Why the dispatcher could not use this verifier spec (empty when it can)."""
    from sandbox_workers.verifiers import default_registry

    plugin, why = default_registry().lookup(spec)
    return [] if plugin is not None else [f"verifier: {why}"]


def chat(messages: Sequence[MessageIn]) -> list[ChatMessage]:
    return [
        ChatMessage(
            role=m.role,
            content=text_of(m),
            name=m.name,
            tool_calls=[
                ToolCall(
                    id=c.id,
                    type=c.type,
                    function=FunctionCall(name=c.function.name, arguments=c.function.arguments),
                )
                for c in m.tool_calls
            ],
            tool_call_id=m.tool_call_id,
        )
        for m in messages
    ]


def build_trajectory(
    req: TraceIn, limits: Limits, tok: Tokenizer | None, trajectory_id: str | None = None
) -> Trajectory:
    """The Trajectory (origin=production, a group of its own) of a trace; Invalid lists
    every problem. `tok` may be None only when the client sends token ids."""
    problems = check_conversation(req.messages, limits)
    problems += _check_tokens(req, tok.vocab_size if tok is not None else None)
    spec = verifier_spec(req.verifier)
    if req.verifier is not None:
        problems += verifier_problems(spec)
        if req.feedback is not None:
            problems.append("verifier, feedback: send one: a trace is scored by either")
    if problems:
        raise Invalid(problems)
    mask: list[int] | None
    if req.prompt_token_ids is not None and req.completion_token_ids is not None:
        prompt, completion = req.prompt_token_ids, req.completion_token_ids
        mask = None if req.completion_mask is None else list(req.completion_mask)
    elif tok is None:
        raise Invalid(["prompt_token_ids: required: this gateway has no tokenizer configured"])
    else:
        prompt, completion, mask = render(req, tok)
    n = len(prompt) + len(completion)
    if limits.max_tokens is not None and n > limits.max_tokens:
        why = f"{n} tokens, at most {limits.max_tokens} (ingest.max_tokens): shorten the trace"
        raise Invalid([f"messages: {why}"])
    assistant = [m for m in req.messages if m.role == "assistant"]
    tid = trajectory_id or new_id()
    return Trajectory(
        id=tid,
        origin=Origin.PRODUCTION,
        task_id=req.task_id or limits.task_id,
        suite=req.suite,
        group_id=tid,
        group_size=1,
        index=0,
        messages=chat(req.messages),
        prompt_tokens=pack_i32(prompt),
        completion_tokens=pack_i32(completion),
        completion_mask=None if mask is None or all(mask) else bytes(mask),
        behaviour_logprobs=None if req.logprobs is None else pack_f32(req.logprobs),
        policy_version=req.policy_version,
        verifier=spec,
        completion=text_of(assistant[-1]) or "",
        turns=len(assistant),
        finish_reason=req.finish_reason,
    )
