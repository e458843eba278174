"""Autoregressive sampling with per-token behaviour logprobs, shared by every policy.

A policy supplies one function, ``step(new_tokens, cache) -> (last_logits, cache)``: feed
the new tokens (the prompt first, then one token at a time) and get the logits of the next
token for each row. Sampling applies temperature, then nucleus (top-p) truncation, and
records the log-probability of each drawn token under the distribution it was drawn from,
after both; that is the behaviour policy the learner corrects for. ``temperature <= 0``
is greedy decoding (logprob 0: the choice was certain).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

StepFn = Callable[[Tensor, Any], tuple[Tensor, Any]]


@dataclass
class Completion:
    tokens: list[int]
    """Sampled token ids (including the end-of-sequence token if one was drawn)."""
    logprobs: list[float]
    """Log-probability of each token under the sampling distribution."""
    finish_reason: str
    """stop (end-of-sequence drawn) | length (max_new_tokens reached)."""


def nucleus_logprobs(logits: Tensor, temperature: float, top_p: float) -> Tensor:
    """Log-probabilities ``[N, V]`` of the sampling distribution: temperature, then top-p
    (tokens outside the nucleus get -inf; the rest are renormalised)."""
    logp = torch.log_softmax(logits.float() / temperature, dim=-1)
    if top_p >= 1.0:
        return logp
    sorted_logp, order = torch.sort(logp, dim=-1, descending=True)
    cum = sorted_logp.exp().cumsum(-1)
    outside = cum - sorted_logp.exp() >= top_p  # mass before this token already reached p
    sorted_logp = sorted_logp.masked_fill(outside, float("-inf"))
    kept = torch.full_like(logp, float("-inf")).scatter(-1, order, sorted_logp)
    return torch.log_softmax(kept, dim=-1)


@torch.no_grad()
def sample(
    step: StepFn,
    prompt_ids: Sequence[int],
    n: int,
    *,
    max_new_tokens: int,
    eos_id: int,
    device: torch.device,
    temperature: float = 1.0,
    top_p: float = 1.0,
    generator: torch.Generator | None = None,
) -> list[Completion]:
    """Draw ``n`` completions of one prompt, batched (a group shares its prompt)."""
    if not prompt_ids:
        raise ValueError("sample: empty prompt")
    inputs = torch.tensor([list(prompt_ids)] * n, dtype=torch.long, device=device)
    done = torch.zeros(n, dtype=torch.bool, device=device)
    tokens: list[Tensor] = []
    logprobs: list[Tensor] = []
    cache: Any = None
    for _ in range(max_new_tokens):
        logits, cache = step(inputs, cache)
        if temperature <= 0:
            nxt = logits.argmax(-1)
            lp = torch.zeros(n, device=device)
        else:
            dist = nucleus_logprobs(logits, temperature, top_p)
            nxt = torch.multinomial(dist.exp(), 1, generator=generator).squeeze(-1)
            lp = dist.gather(-1, nxt[:, None]).squeeze(-1)
        tokens.append(nxt)
        logprobs.append(lp)
        done |= nxt == eos_id
        if bool(done.all()):
            break
        inputs = nxt[:, None]
    return _completions(tokens, logprobs, eos_id, n)


def _completions(
    tokens: list[Tensor], logprobs: list[Tensor], eos: int, n: int
) -> list[Completion]:
    if not tokens:
        return [Completion([], [], "length") for _ in range(n)]
    toks = torch.stack(tokens, 1).tolist()
    lps = torch.stack(logprobs, 1).tolist()
    out = []
    for row_t, row_l in zip(toks, lps, strict=True):
        end = row_t.index(eos) + 1 if eos in row_t else len(row_t)
        reason = "stop" if eos in row_t else "length"
        out.append(Completion(row_t[:end], row_l[:end], reason))
    return out
