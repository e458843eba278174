"""The rollout path: Task -> Trajectory -> ScoredTrajectory (DESIGN.md sections 1, 5, 7).

Token ids, behaviour logprobs and per-token policy versions travel as packed little-endian
arrays (schemas/arrays.py). Every per-completion-token array has exactly one element per
completion token; __post_init__ checks it, both when a producer builds a message and when
the codec decodes one.
"""

from __future__ import annotations

import math
from typing import Annotated

import msgspec

from schemas.chat import ChatMessage
from schemas.envelope import Message, now
from schemas.fields import (
    LESS_THAN_KEY,
    Count,
    GroupSize,
    Key,
    PackedI32,
    PerTokenF32,
    PerTokenI32,
    PerTokenU8,
)
from schemas.sandbox import Outcome, VerifierSpec

IndexInGroup = Annotated[int, msgspec.Meta(ge=0, extra_json_schema={LESS_THAN_KEY: "group_size"})]
MaxTurns = Annotated[int, msgspec.Meta(ge=1, le=256)]


class Task(Message, kw_only=True):
    """A problem to roll out. Topic `tasks`, key task_id."""

    task_id: Key
    """Stable id of the problem (the same across epochs). writer: task feeder; reader:
    generator, dispatcher (pass rates per task), ledger."""
    suite: Key
    """Suite the task belongs to; the feeder samples suites by weight. writer: task feeder;
    reader: generator (copies it), dispatcher (pass rates per suite)."""
    prompt: str | None = None
    """The prompt as plain text. Exactly one of prompt and messages is set. writer: task
    feeder; reader: generator."""
    messages: list[ChatMessage] = msgspec.field(default_factory=list)
    """The prompt as a conversation (OpenAI chat format). writer: task feeder; reader:
    generator (chat template)."""
    verifier: VerifierSpec
    """How completions are judged. writer: task feeder; reader: generator (copies it into
    each trajectory)."""
    group_size: GroupSize
    """Completions to sample for this task (one advantage group). writer: task feeder;
    reader: generator, dispatcher (group completeness)."""
    max_turns: MaxTurns = 1
    """Turn budget of a multi-turn episode (1 = single completion). writer: task feeder;
    reader: generator."""
    metadata: dict[str, str] = msgspec.field(default_factory=dict)
    """Free-form labels (source dataset, difficulty ...). writer: task feeder; reader:
    metrics, people."""
    reference: str | None = None
    """A reference solution, never shown to the policy. writer: task author; reader: tests,
    people (a task whose reference fails its verifier is broken)."""

    def __post_init__(self) -> None:
        if (self.prompt is None) == (not self.messages):
            raise ValueError("a Task needs exactly one of `prompt` and `messages`")


class Trajectory(Message, kw_only=True):
    """One sampled episode of a task. Topic `trajectories`, key group_id. The envelope id is
    the trajectory id; origin tells live, replay and production traces apart."""

    task_id: Key
    """The task sampled. writer: generator, ingest; reader: dispatcher, ledger."""
    suite: str = ""
    """Copied from the task. writer: generator; reader: dispatcher (pass rates per suite)."""
    group_id: Key
    """Advantage group: the trajectories sampled together for one task; the Kafka key.
    writer: generator (ingest: one group per trace); reader: dispatcher (group join)."""
    group_size: GroupSize
    """Size of the group. writer: generator; reader: dispatcher (group completeness)."""
    index: IndexInGroup = 0
    """Position in the group, 0 <= index < group_size. writer: generator; reader:
    dispatcher (dedup within the group)."""
    messages: list[ChatMessage] = msgspec.field(default_factory=list)
    """The whole episode in chat format: prompt, then each assistant turn and each tool or
    sandbox observation. writer: generator, ingest; reader: dispatcher, learner (production
    traces), people."""
    prompt_tokens: PackedI32 = b""
    """Token ids of the prompt, packed int32. writer: generator; reader: learner."""
    completion_tokens: PackedI32 = b""
    """Token ids after the prompt, packed int32: every assistant turn and, in multi-turn
    episodes, the observation tokens between them (see completion_mask). writer:
    generator; reader: learner."""
    completion_mask: PerTokenU8 | None = None
    """One byte per completion token: 1 = sampled by the policy (trained on), 0 = inserted
    observation (not trained on). None = every completion token was sampled. writer:
    generator (multi-turn); reader: learner (loss mask)."""
    behaviour_logprobs: PerTokenF32 | None = None
    """Log-probability of each completion token under the policy that sampled it, packed
    float32 (0.0 where completion_mask is 0). None for production traces. writer:
    generator; reader: learner (importance ratios)."""
    policy_versions: PerTokenI32 = b""
    """Policy version that sampled each completion token, packed int32 (-1 where
    completion_mask is 0); weights may change mid-episode. Empty when unknown (production).
    writer: generator; reader: learner (staleness per token)."""
    policy_version: Annotated[int, msgspec.Meta(ge=-1)] = -1
    """Policy version when the episode started; -1 when unknown (production). writer:
    generator; reader: learner (staleness drop), generator pacing."""
    generator_id: str = ""
    """Which generator process sampled it. writer: generator; reader: operators."""
    verifier: VerifierSpec
    """How to judge it (copied from the task). writer: generator, ingest, replay (may swap
    the verifier version on purpose); reader: dispatcher."""
    completion: str = ""
    """Text of the policy's final assistant turn; the dispatcher extracts code from it.
    writer: generator, ingest; reader: dispatcher."""
    turns: Count = 1
    """Number of assistant turns in the episode. writer: generator, ingest; reader:
    metrics, learner."""
    finish_reason: str = ""
    """Why sampling stopped: stop | length | tool_calls | turn_limit. writer: generator;
    reader: dispatcher (a `length` cut can be penalised), metrics."""

    def __post_init__(self) -> None:
        if len(self.prompt_tokens) % 4:
            raise ValueError("prompt_tokens: length is not a multiple of 4 (packed int32)")
        if len(self.completion_tokens) % 4:
            raise ValueError("completion_tokens: length is not a multiple of 4 (packed int32)")
        n = len(self.completion_tokens) // 4
        _aligned("completion_mask", self.completion_mask, n, 1)
        _aligned("behaviour_logprobs", self.behaviour_logprobs, n, 4)
        if self.policy_versions:
            _aligned("policy_versions", self.policy_versions, n, 4)
        if self.index >= self.group_size:
            raise ValueError(f"index {self.index} is not below group_size {self.group_size}")

    @property
    def n_completion_tokens(self) -> int:
        return len(self.completion_tokens) // 4


def _aligned(field: str, data: bytes | None, n_tokens: int, width: int) -> None:
    if data is not None and len(data) != n_tokens * width:
        raise ValueError(
            f"{field}: {len(data)} bytes, expected {n_tokens * width} "
            f"({n_tokens} completion tokens x {width} bytes)"
        )


class ScoredTrajectory(Message, kw_only=True):
    """A trajectory with its reward. Topic `rewards`, key group_id (of the trajectory).
    The envelope's parent_id is the trajectory's id; the learner dedups on trajectory_id."""

    trajectory: Trajectory
    """The scored trajectory, unchanged. writer: dispatcher; reader: learner."""
    reward: float
    """Scalar reward (finite). writer: dispatcher; reader: learner."""
    advantage: float = 0.0
    """Group-relative advantage (finite). writer: dispatcher; reader: learner."""
    outcome: Outcome
    """How the sandbox job ended (or passed/failed for in-process verifiers). writer:
    dispatcher; reader: learner (metrics), ledger."""
    passed: Count = 0
    """Tests or cases passed. writer: dispatcher (from the result); reader: metrics."""
    total: Count = 0
    """Tests or cases counted. writer: dispatcher; reader: metrics."""
    components: dict[str, float] = msgspec.field(default_factory=dict)
    """Named parts of the reward (pass_fraction, length_penalty ...). writer: dispatcher;
    reader: learner (TensorBoard), people."""
    group_size_scored: Count = 0
    """How many of the group were scored when the advantage was computed (less than the
    group size when the group's deadline passed). writer: dispatcher; reader: learner."""
    masked: bool = False
    """True: do not train on this sample (sandbox_error after retries ...). writer:
    dispatcher; reader: learner (skips it, records it in the ledger)."""
    mask_reason: str = ""
    """Why it is masked; required when masked. writer: dispatcher; reader: ledger, people."""
    dispatcher_id: str = ""
    """Which dispatcher scored it. writer: dispatcher; reader: operators."""
    scored_at: float = msgspec.field(default_factory=now)
    """Unix seconds when scored. writer: dispatcher; reader: metrics (scoring latency)."""
    verifier_name: str = ""
    """Verifier that judged (from the sandbox result). writer: dispatcher; reader: audit."""
    verifier_version: str = ""
    """Its version. writer: dispatcher; reader: audit, replay."""
    image_digest: str = ""
    """Sandbox image the job ran in; empty for in-process verifiers. writer: dispatcher;
    reader: audit, replay."""

    def __post_init__(self) -> None:
        if not (math.isfinite(self.reward) and math.isfinite(self.advantage)):
            raise ValueError(f"reward {self.reward} and advantage {self.advantage} must be finite")
        if self.passed > self.total:
            raise ValueError(f"passed {self.passed} exceeds total {self.total}")
        if self.masked and not self.mask_reason:
            raise ValueError("a masked sample needs a mask_reason")

    @property
    def group_id(self) -> str:
        """The Kafka key of `rewards`."""
        return self.trajectory.group_id

    @property
    def trajectory_id(self) -> str:
        """The learner's idempotency key: one training use per trajectory."""
        return self.trajectory.id
