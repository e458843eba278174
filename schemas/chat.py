"""Chat messages in the OpenAI chat-completions format (role, content, name, tool calls).

Used inside Task (the prompt as a conversation) and Trajectory (the whole multi-turn
episode). Production traces arrive in this format at the ingest gateway and are kept as is.
"""

from __future__ import annotations

from typing import Final

import msgspec

ROLES: Final = frozenset({"system", "developer", "user", "assistant", "tool"})
"""Roles rollstream's own writers use. Readers accept any role string (a newer API's roles
must not turn a production trace into a dead letter); the ingest gateway checks ROLES."""


class FunctionCall(msgspec.Struct, kw_only=True):
    """The function an assistant message asks to call."""

    name: str
    """Function name. writer: generator, ingest; reader: generator (tool dispatch), learner."""
    arguments: str = ""
    """Arguments as a JSON document in a string, exactly as the model wrote it (it may be
    invalid JSON; that is the model's problem to be scored on). writer: generator, ingest;
    reader: generator (tool dispatch)."""


class ToolCall(msgspec.Struct, kw_only=True):
    """One tool call of an assistant message."""

    id: str
    """Call id, echoed by the tool message answering it. writer: generator, ingest;
    reader: generator (matches results to calls)."""
    type: str = "function"
    """Always "function" today. writer: generator, ingest; reader: generator."""
    function: FunctionCall
    """What to call. writer: generator, ingest; reader: generator."""


class ChatMessage(msgspec.Struct, kw_only=True):
    """One message of a conversation, OpenAI chat format."""

    role: str
    """system | developer | user | assistant | tool. writer: feeder, generator, ingest;
    reader: generator (chat template), learner (which turns are the policy's)."""
    content: str | None = None
    """Text of the message; None for an assistant message that only calls tools.
    writer: feeder, generator, ingest; reader: generator, dispatcher (code extraction)."""
    name: str | None = None
    """Optional participant name. writer: ingest, feeder; reader: generator (chat template)."""
    tool_calls: list[ToolCall] = msgspec.field(default_factory=list)
    """Tool calls of an assistant message. writer: generator, ingest; reader: generator."""
    tool_call_id: str | None = None
    """For role=tool: the id of the call this message answers. writer: generator, ingest;
    reader: generator, learner."""
