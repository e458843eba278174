"""The gateway's HTTP bodies (pydantic models: they make the OpenAPI spec and the first
line of validation). Chat messages follow the OpenAI chat-completions format; fields of it
that rollstream does not keep (audio, refusal ...) are accepted and ignored, while unknown
top-level fields of a request are refused (a typo there would otherwise lose data)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

ClientId = Annotated[
    str,
    StringConstraints(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._:@/-]*$"),
]
"""A client-chosen request id: letters, digits and `._:@/-`, at most 128 characters."""
Name = Annotated[str, StringConstraints(min_length=1, max_length=256)]
Text = Annotated[str, StringConstraints(max_length=16 << 20)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="ignore")


class FunctionCallIn(_Lenient):
    name: Name
    """Function the assistant calls."""
    arguments: Text = ""
    """Its arguments: a JSON document in a string, exactly as the model wrote it."""


class ToolCallIn(_Lenient):
    id: Name
    """Call id; the tool message answering it repeats it as tool_call_id."""
    type: Literal["function"] = "function"
    function: FunctionCallIn


class TextPart(_Lenient):
    type: Literal["text"]
    text: Text


class MessageIn(_Lenient):
    """One chat message (OpenAI format)."""

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Text | list[TextPart] | None = None
    """Text, or a list of text parts (joined); null for an assistant message that only
    calls tools."""
    name: Name | None = None
    tool_calls: Annotated[list[ToolCallIn], Field(max_length=256)] = []
    tool_call_id: Name | None = None
    """For role=tool: the id of the call this message answers."""


class FunctionSpecIn(_Lenient):
    name: Name
    description: Text = ""
    parameters: dict[str, Any] = {}
    """JSON Schema of the arguments."""


class ToolIn(_Lenient):
    """A tool the agent could call (OpenAI `tools` entry)."""

    type: Literal["function"] = "function"
    function: FunctionSpecIn


class IOCaseIn(_Strict):
    stdin: Text = ""
    stdout: Text


class VerifierIn(_Strict):
    """Score the trace with a verifier (as rollouts are) instead of waiting for feedback."""

    name: Literal["python_tests", "stdin_stdout", "math_answer", "exact", "regex"]
    version: Name | None = None
    tests: Text | None = None
    cases: Annotated[list[IOCaseIn], Field(max_length=10_000)] = []
    answer: Text | None = None
    pattern: Text | None = None
    needs_sandbox: bool | None = None
    """Default: true for python_tests and stdin_stdout, false for the others."""


class Judgement(_Strict):
    """A judgement of a trace: at least one of score, label and thumbs."""

    score: Annotated[float, Field(allow_inf_nan=False)] | None = None
    """Numeric score within [ingest.score_min, ingest.score_max] (default 0..1)."""
    label: Annotated[str, StringConstraints(min_length=1, max_length=64)] | None = None
    """A label with a configured reward (ingest.label_rewards: correct, incorrect ...)."""
    thumbs: Literal[-1, 0, 1] | None = None
    """1 up, 0 neutral, -1 down."""
    comment: Annotated[str, StringConstraints(max_length=4000)] = ""


class TraceIn(_Strict):
    """A production agent trace."""

    id: ClientId
    """Your id for this trace: a retry with the same id and body publishes nothing new."""
    messages: Annotated[list[MessageIn], Field(min_length=2, max_length=100_000)]
    """The whole conversation: prompt (system/user ...), then the agent's turns and tool
    results. At least one message before the first assistant message, and one assistant
    message."""
    tools: Annotated[list[ToolIn], Field(max_length=1024)] = []
    """Tools offered to the agent (they are part of what it saw)."""
    task_id: Name | None = None
    """What the agent was doing (default: ingest.task_id)."""
    suite: Annotated[str, StringConstraints(max_length=256)] = ""
    policy_version: Annotated[int, Field(ge=-1, le=2**31 - 1)] = -1
    """Version of rollstream's policy that produced it; -1 when unknown."""
    finish_reason: Annotated[str, StringConstraints(max_length=64)] = ""
    prompt_token_ids: list[Annotated[int, Field(ge=0, le=2**31 - 1)]] | None = None
    """Token ids of the prompt under the policy's tokenizer. With completion_token_ids;
    omit both to let the gateway tokenise the messages."""
    completion_token_ids: list[Annotated[int, Field(ge=0, le=2**31 - 1)]] | None = None
    completion_mask: list[Literal[0, 1]] | None = None
    """Per completion token: 1 sampled by the agent, 0 inserted (tool output)."""
    logprobs: list[Annotated[float, Field(allow_inf_nan=False, le=0.0)]] | None = None
    """Per completion token: its log-probability when sampled (only with token ids)."""
    verifier: VerifierIn | None = None
    """Have the trace scored by this verifier now, instead of by feedback."""
    feedback: Judgement | None = None
    """Feedback already known: the trace is scored with it at once."""


class FeedbackIn(Judgement):
    """A judgement of an earlier trace."""

    id: ClientId
    """Your id for this feedback: a retry with the same id publishes nothing new."""
    trace_id: Name
    """The trajectory_id the gateway returned for the trace, or the id you gave it."""


class Accepted(BaseModel):
    trajectory_id: str
    """rollstream's id of the trace (the trajectory id in topics and the ledger)."""
    status: Literal["awaiting_feedback", "scoring", "scored"]
    """awaiting_feedback: held until feedback arrives; scoring: sent to the verifier;
    scored: published with the feedback it came with."""
    duplicate: bool = False
    """True when this id was accepted before (nothing new was published)."""


class FeedbackAccepted(BaseModel):
    feedback_id: str
    trajectory_id: str
    reward: float
    advantage: float
    duplicate: bool = False


class Problem(BaseModel):
    """Every error response."""

    error: str
    """What is wrong, and what to do about it."""
    problems: list[str] = []
    """One line per invalid field: `location: why`."""


class Health(BaseModel):
    status: Literal["ok", "degraded"]
    redis: bool
    kafka: bool
