"""From sampled turns to a Trajectory message, pure (DESIGN.md sections 2 and 7).

An episode is the prompt, then assistant turns, and in multi-turn mode the sandbox's
observation between two turns. The trajectory's completion is everything after the
prompt; per completion token it carries the behaviour logprob (0.0 on observation
tokens), the policy version that sampled it (-1 on observation tokens) and, when there
are observations, the mask of sampled tokens (1) versus inserted ones (0).
"""

from __future__ import annotations

from dataclasses import dataclass

from schemas.arrays import pack_f32, pack_i32
from schemas.chat import ChatMessage
from schemas.rollout import Task, Trajectory
from schemas.sandbox import SandboxResult


@dataclass
class Turn:
    """One assistant turn as sampled."""

    tokens: list[int]
    logprobs: list[float]
    version: int
    """Policy version that sampled every token of this turn (weights swap between turns)."""
    text: str
    finish_reason: str


@dataclass
class Observation:
    """What the environment answered, inserted between two turns (not trained on)."""

    tokens: list[int]
    text: str


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
            versions += [part.version] * n
            mask += [1] * n
            messages.append(ChatMessage(role="assistant", content=part.text))
        else:
            logprobs += [0.0] * n
            versions += [-1] * n
            mask += [0] * n
            messages.append(ChatMessage(role="user", content=part.text))
    observed = any(isinstance(p, Observation) for p in parts)
    extra = {"id": trajectory_id} if trajectory_id else {}
    return Trajectory(
        **extra,
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
