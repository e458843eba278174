"""The `Policy` protocol: what the learner (and the generators) need from a language model.

Two implementations: `learner.tiny.TinyPolicy` (a small built-in decoder-only transformer
with a byte-level tokenizer) and `learner.hf.HFPolicy` (a Hugging Face causal LM loaded
from a local path); both use the helpers below. This module imports neither: the factory
`learner.spec.build_policy(spec)` does, so the backends depend on this module only.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

import torch
from torch import Tensor, nn

from learner.sampling import BetweenSteps, Completion


@runtime_checkable
class Policy(Protocol):
    """A causal language model the learner can train and the generators can sample from.

    Implementations are `torch.nn.Module`s; `to`, `train` and `eval` are theirs."""

    vocab_size: int
    max_seq_len: int
    pad_id: int
    eos_id: int

    def token_logprobs(
        self,
        tokens: Tensor,
        attention_mask: Tensor | None = None,
        *,
        temperature: float = 1.0,
        with_entropy: bool = False,
        shared_prefix: int = 0,
    ) -> tuple[Tensor, Tensor | None]:
        """log p(tokens[:, t+1] | tokens[:, :t+1]) as ``[B, T-1]`` float32, and the entropy
        of each of those next-token distributions when asked. ``tokens`` is right-padded;
        ``attention_mask`` marks real tokens. Logits are divided by ``temperature`` so the
        numbers match a sampler that used it. ``shared_prefix`` > 0 promises that every
        row's first that many tokens are the same (a group's prompt): an implementation may
        run them once, with the same result."""
        ...

    def trainable_parameters(self) -> Iterator[nn.Parameter]:
        """The parameters the optimizer updates."""
        ...

    def weights(self) -> dict[str, Tensor]:
        """A state dict for publishing and checkpoints: CPU, contiguous, no shared storage."""
        ...

    def load_weights(self, state: Mapping[str, Tensor]) -> None:
        """Load a state dict produced by `weights()` (strict: every key must match)."""
        ...

    def spec(self) -> dict[str, Any]:
        """JSON-able description from which `learner.spec.build_policy` rebuilds the
        architecture."""
        ...

    def sample(
        self,
        prompt_ids: Sequence[int],
        n: int = 1,
        *,
        max_new_tokens: int = 64,
        temperature: float = 1.0,
        top_p: float = 1.0,
        generator: torch.Generator | None = None,
        between_steps: BetweenSteps | None = None,
        version: int = -1,
    ) -> list[Completion]:
        """Sample ``n`` completions of one prompt, each with the per-token logprobs of the
        distribution it was actually drawn from (the behaviour logprobs) and the policy
        version of each token; `between_steps` may swap weights in between decoding steps
        (learner/sampling.py)."""
        ...

    def to(self, *args: Any, **kwargs: Any) -> Any: ...

    def train(self, mode: bool = True) -> Any: ...

    def eval(self) -> Any: ...


def logprobs_from_logits(
    logits: Tensor, targets: Tensor, temperature: float = 1.0, with_entropy: bool = False
) -> tuple[Tensor, Tensor | None]:
    """Per-position log-probability of ``targets`` under ``softmax(logits / temperature)``
    (float32 whatever the logits' dtype), and optionally the entropy of that distribution."""
    scaled = logits.float() / temperature
    log_z = torch.logsumexp(scaled, dim=-1)
    logp = scaled.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - log_z
    entropy = None
    if with_entropy:
        probs = torch.softmax(scaled, dim=-1)
        entropy = log_z - (probs * scaled).sum(-1)
    return logp, entropy


def export_state(module: nn.Module) -> dict[str, Tensor]:
    """The module's state dict detached onto the CPU, contiguous, each tensor its own copy
    (safetensors refuses shared storage, e.g. tied embeddings)."""
    return {k: v.detach().to("cpu").contiguous().clone() for k, v in module.state_dict().items()}
