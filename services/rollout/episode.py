"""The Episode protocol and the pieces every episode is made of (DESIGN.md sections 2, 7).

An episode is the prompt, then assistant turns, and between two turns what the
environment answered (the sandbox's verdict, a tool's result): an observation. The
trajectory's completion is everything after the prompt; per completion token it carries
the behaviour logprob (0.0 on observation tokens), the policy version that sampled it (-1
on observation tokens) and, when there are observations, the mask of sampled tokens (1)
versus inserted ones (0).

An environment is one class implementing `Episode` (services/rollout/episodes.py holds
the registry, the generator asks it which episode runs a task): it samples turns through
the generator's `Sampler` and builds its trajectories with `Context.trajectory`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from schemas.arrays import pack_f32, pack_i32
from schemas.chat import ChatMessage, ToolCall
from schemas.envelope import new_id
from schemas.rollout import Task, Trajectory
from schemas.sandbox import SandboxResult

if TYPE_CHECKING:
    from aiokafka import AIOKafkaProducer

    from schemas.claimcheck import ClaimCheck
    from services.rollout.textcodec import TextCodec
    from services.settings import Settings


@dataclass
class Turn:
    """One assistant turn as sampled."""

    tokens: list[int]
    logprobs: list[float]
    version: int
    """Policy version that sampled the turn's first token."""
    text: str
    finish_reason: str
    tool_calls: list[ToolCall] = field(default_factory=list)
    """The tool calls the turn made (tool-calling episodes)."""
    versions: list[int] | None = None
    """Policy version of each token (weights may swap between decoding steps). None:
    `version` for every token."""


@dataclass
class Observation:
    """What the environment answered, inserted between two turns (not trained on)."""

    tokens: list[int]
    text: str
    role: str = "user"
    """Chat role of the observation: `user` (sandbox verdicts), `tool` (a tool's result)."""
    tool_call_id: str | None = None
    """For role `tool`: the call it answers."""


Part = Turn | Observation


def trajectory(
    task: Task,
    *,
    group_id: str,
    index: int,
    prompt_ids: list[int],
    prompt_text: str,
    parts: list[Part],
    generator_id: str,
    finish_reason: str | None = None,
    trajectory_id: str | None = None,
) -> Trajectory:
    """The Trajectory of one episode. `parts` starts with a Turn and alternates."""
    turns = [p for p in parts if isinstance(p, Turn)]
    if not turns or not isinstance(parts[0], Turn):
        raise ValueError("an episode starts with an assistant turn")
    tokens: list[int] = []
    logprobs: list[float] = []
    versions: list[int] = []
    mask: list[int] = []
    messages = list(task.messages) or [ChatMessage(role="user", content=prompt_text)]
    for part in parts:
        n = len(part.tokens)
        tokens += part.tokens
        if isinstance(part, Turn):
            if len(part.logprobs) != n:
                raise ValueError(f"turn has {n} tokens but {len(part.logprobs)} logprobs")
            logprobs += part.logprobs
            versions += part.versions if part.versions is not None else [part.version] * n
            mask += [1] * n
            calls = list(part.tool_calls)
            messages.append(ChatMessage(role="assistant", content=part.text, tool_calls=calls))
        else:
            logprobs += [0.0] * n
            versions += [-1] * n
            mask += [0] * n
            messages.append(
                ChatMessage(role=part.role, content=part.text, tool_call_id=part.tool_call_id)
            )
    observed = any(isinstance(p, Observation) for p in parts)
    return Trajectory(
        id=trajectory_id or new_id(),
        task_id=task.task_id,
        suite=task.suite,
        group_id=group_id,
        group_size=task.group_size,
        index=index,
        messages=messages,
        prompt_tokens=pack_i32(prompt_ids),
        completion_tokens=pack_i32(tokens),
        completion_mask=bytes(mask) if observed else None,
        behaviour_logprobs=pack_f32(logprobs),
        policy_versions=pack_i32(versions),
        policy_version=turns[0].version,
        generator_id=generator_id,
        verifier=task.verifier,
        completion=turns[-1].text,
        turns=len(turns),
        finish_reason=finish_reason or turns[-1].finish_reason,
    )


def observation_text(result: SandboxResult | None, max_chars: int) -> str:
    """The observation appended after a turn whose code did not pass."""
    if result is None:
        body = "no verdict (the sandbox did not answer in time)"
    else:
        body = f"{result.outcome.value}: {result.passed}/{result.total} tests passed"
        extra = (result.detail or result.stderr).strip()
        if extra:
            body += f"; {extra}"
    return f"\n# sandbox: {body[:max_chars]}\n"


# -- the protocol -------------------------------------------------------------------------


class Sampler(Protocol):
    """What an episode samples with: the generator's policy, under its lock."""

    @property
    def max_seq_len(self) -> int: ...

    async def turns(self, context: list[int], n: int, stop: Sequence[str] = ()) -> list[Turn]:
        """`n` completions of the token ids `context`, with the newest verified weights
        (swapped in first, never during a sequence); each turn records its version and
        ends after the first of the `stop` strings it writes (kept in its text)."""
        ...


@dataclass
class Context:
    """What an episode may use: the run's settings, the generator's sampler and text codec,
    and the producer and claim check (to reach the sandbox tier over Kafka)."""

    settings: Settings
    sampler: Sampler
    codec: TextCodec
    generator_id: str
    producer: AIOKafkaProducer
    """The generator's (started)."""
    claim: ClaimCheck

    def trajectory(
        self,
        task: Task,
        group_id: str,
        index: int,
        prompt_ids: list[int],
        parts: list[Part],
        finish_reason: str | None = None,
        trajectory_id: str | None = None,
    ) -> Trajectory:
        return trajectory(
            task,
            group_id=group_id,
            index=index,
            prompt_ids=prompt_ids,
            prompt_text=self.codec.text(prompt_ids),
            parts=parts,
            generator_id=self.generator_id,
            finish_reason=finish_reason,
            trajectory_id=trajectory_id,
        )


class Episode(Protocol):
    """One kind of environment (single turn, multi-turn with the sandbox, tool calling ...):
    the generator picks the first registered kind whose `accepts` takes the task, builds it
    once with the Context, and runs every such task's group through `group`."""

    def __init__(self, ctx: Context) -> None: ...

    @classmethod
    def accepts(cls, task: Task) -> bool:
        """Whether this environment runs `task`."""
        ...

    async def group(self, task: Task, group_id: str) -> list[Trajectory]:
        """The task's group: `task.group_size` trajectories (index 0 .. group_size - 1)."""
        ...

    async def close(self) -> None:
        """Release what the episode started (clients, tasks)."""
        ...


Step = Callable[[int, Turn], Awaitable[tuple[list[Observation], str | None]]]
"""After turn `t` (not the last): the observations to append (none: the episode ends) and
the finish reason (set: the episode ends after them)."""


async def turn_loop(
    ctx: Context, prompt_ids: list[int], max_turns: int, step: Step, stop: Sequence[str] = ()
) -> tuple[list[Part], str | None]:
    """The parts of a multi-turn episode and its finish reason: sample a turn; after every
    turn but the last, `step` answers it; `length` when the answer does not fit under
    max_seq_len, `turn_limit` when the budget runs out."""
    parts: list[Part] = []
    context = list(prompt_ids)
    for t in range(max_turns):
        (turn,) = await ctx.sampler.turns(context, 1, stop)
        parts.append(turn)
        context += turn.tokens
        if t == max_turns - 1:
            return parts, ("turn_limit" if max_turns > 1 else None)
        observations, reason = await step(t, turn)
        if not observations:
            return parts, reason
        tokens = [tok for obs in observations for tok in obs.tokens]
        if len(context) + len(tokens) + 2 > ctx.sampler.max_seq_len:
            return parts, "length"
        parts += observations
        context += tokens
        if reason is not None:
            return parts, reason
    return parts, None
