"""The learner's view of one scored trajectory, and the padded tensors of a micro-batch."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from learner import staleness

_I32 = np.dtype("<i4")
_F32 = np.dtype("<f4")


@dataclass
class Sample:
    trajectory_id: str
    group_id: str
    prompt: np.ndarray
    """Prompt token ids (int32)."""
    completion: np.ndarray
    """Completion token ids (int32)."""
    advantage: float
    reward: float = 0.0
    train_mask: np.ndarray | None = None
    """Bool per completion token: trained on (sampled by the policy). None: all."""
    behaviour_logp: np.ndarray | None = None
    """float32 per completion token; None for production traces."""
    token_versions: np.ndarray | None = None
    """int32 policy version per completion token (-1 for inserted tokens); None: unknown."""
    policy_version: int = -1
    task_id: str = ""
    origin: str = "live"

    @property
    def length(self) -> int:
        return len(self.prompt) + len(self.completion)

    @property
    def trained_tokens(self) -> int:
        if self.train_mask is None:
            return len(self.completion)
        return int(self.train_mask.sum())

    @property
    def version(self) -> int:
        """Oldest policy version that sampled it; -1 when unknown."""
        versions = self.token_versions if self.token_versions is not None else ()
        return staleness.oldest_version((int(v) for v in versions), self.policy_version)


def from_scored(msg: object) -> Sample:
    """A `schemas.messages.ScoredTrajectory` as a Sample (arrays copied out of the bytes)."""
    from schemas.messages import ScoredTrajectory

    if not isinstance(msg, ScoredTrajectory):
        raise TypeError(f"expected ScoredTrajectory, got {type(msg).__name__}")
    t = msg.trajectory
    mask = np.frombuffer(t.completion_mask, np.uint8).astype(bool) if t.completion_mask else None
    return Sample(
        trajectory_id=t.id,
        group_id=t.group_id,
        prompt=np.frombuffer(t.prompt_tokens, _I32).astype(np.int32),
        completion=np.frombuffer(t.completion_tokens, _I32).astype(np.int32),
        advantage=float(msg.advantage),
        reward=float(msg.reward),
        train_mask=mask,
        behaviour_logp=(
            np.frombuffer(t.behaviour_logprobs, _F32).astype(np.float32)
            if t.behaviour_logprobs is not None
            else None
        ),
        token_versions=(
            np.frombuffer(t.policy_versions, _I32).astype(np.int32) if t.policy_versions else None
        ),
        policy_version=int(t.policy_version),
        task_id=t.task_id,
        origin=str(t.origin),
    )


def problem(sample: Sample, vocab_size: int, max_seq_len: int) -> str | None:
    """Why the learner cannot train on this sample (a ledger reason), or None."""
    if len(sample.prompt) == 0:
        return "invalid: empty prompt (the first completion token has no context)"
    if sample.trained_tokens == 0:
        return "invalid: no trainable completion tokens"
    if sample.length > max_seq_len:
        return f"too long: {sample.length} tokens > max_seq_len {max_seq_len}"
    lo = min(int(sample.prompt.min()), int(sample.completion.min()))
    hi = max(int(sample.prompt.max()), int(sample.completion.max()))
    if lo < 0 or hi >= vocab_size:
        return f"invalid: token id outside the vocabulary [0, {vocab_size})"
    if sample.behaviour_logp is not None and not np.isfinite(sample.behaviour_logp).all():
        return "invalid: non-finite behaviour logprob"
    return None


@dataclass
class Batch:
    tokens: Tensor
    """[B, T] right-padded token ids."""
    attention_mask: Tensor
    """[B, T] 1 on real tokens."""
    loss_mask: Tensor
    """[B, T-1] 1 where the target token is trained on."""
    behaviour_logp: Tensor
    """[B, T-1] behaviour logprob of each target token (0 elsewhere)."""
    has_behaviour: Tensor
    """[B] bool."""
    advantages: Tensor
    """[B]."""


def collate(samples: Sequence[Sample], pad_id: int, device: torch.device | str) -> Batch:
    """Right-pad and align: completion token j sits at position P + j and is predicted at
    logit position P + j - 1 (P = prompt length)."""
    width = max(s.length for s in samples)
    n = len(samples)
    tokens = np.full((n, width), pad_id, dtype=np.int64)
    attn = np.zeros((n, width), dtype=np.int64)
    loss_mask = np.zeros((n, width - 1), dtype=np.float32)
    behaviour = np.zeros((n, width - 1), dtype=np.float32)
    for i, s in enumerate(samples):
        p, c = len(s.prompt), len(s.completion)
        tokens[i, :p] = s.prompt
        tokens[i, p : p + c] = s.completion
        attn[i, : p + c] = 1
        loss_mask[i, p - 1 : p - 1 + c] = 1.0 if s.train_mask is None else s.train_mask
        if s.behaviour_logp is not None:
            behaviour[i, p - 1 : p - 1 + c] = s.behaviour_logp

    def put(a: np.ndarray) -> Tensor:
        return torch.from_numpy(a).to(device, non_blocking=True)

    return Batch(
        tokens=put(tokens),
        attention_mask=put(attn),
        loss_mask=put(loss_mask),
        behaviour_logp=put(behaviour),
        has_behaviour=torch.tensor([s.behaviour_logp is not None for s in samples], device=device),
        advantages=torch.tensor([s.advantage for s in samples], dtype=torch.float32, device=device),
    )
