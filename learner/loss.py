"""The learner's loss: off-policy-corrected policy gradient, pure tensor math.

Every tensor is ``[B, T]`` over the positions that predict the sequence's tokens (``T`` =
sequence length - 1); ``mask`` marks the completion tokens the policy sampled (the ones
trained on). ``advantages`` is ``[B]``, one value per sequence (group-relative, from the
reward dispatcher).

Samples WITH behaviour logprobs (``has_behaviour``) use decoupled PPO: the behaviour
ratio ``rho = pi_theta / mu = exp(logp - logp_behaviour)`` is split at the proximal
policy ``pi_prox`` (the policy at the start of this learner update, detached)::

    rho = (pi_prox / mu) * (pi_theta / pi_prox) =        w        *        r
          importance weight: detached,                    trust region: PPO-clipped
          truncated at ``is_cap``                         to [1 - eps_low, 1 + eps_high]

    token objective = w_trunc * min(r * A, clip(r) * A)

``w`` corrects for the data being sampled by an older policy (truncated importance
sampling: a bounded weight keeps the variance bounded); ``r`` keeps several updates on the
same batch inside a trust region. With one update per batch, ``pi_prox = pi_theta`` so the
gradient is ``w_trunc * A * grad log pi``, and on-policy data (``mu = pi_theta``) gives
exactly the plain policy gradient ``A * grad log pi``. A whole sequence is masked (no
gradient) when its geometric-mean weight leaves ``[seq_mask_low, seq_mask_high]`` or any
token's weight leaves ``[token_mask_low, token_mask_high]``: such samples are too
off-policy (very stale, or sampled by a mismatched engine) to correct by reweighting.

Samples WITHOUT behaviour logprobs (production traces) cannot be importance-weighted. They
train through a reward-weighted likelihood term (advantage-weighted regression, Peng et
al. 2019)::

    token objective = rwl_coef * min(exp(A / rwl_beta), rwl_max_weight) * log pi_theta

The weight is positive, so the term only ever pulls the policy towards such traces, more
strongly the better they scored; it never pushes likelihood down (unbounded on data the
policy did not sample). Optional terms on every trained token: ``kl_coef`` times the k3
estimator of KL(pi_theta || pi_ref) (``exp(q) - q - 1`` with ``q = logp_ref - logp``) and
``- entropy_coef`` times the entropy.

The loss is a sum over tokens divided by ``num_tokens`` (the trained tokens of the whole
optimizer step, so micro-batches add up to the same gradient as one big batch).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from torch import Tensor


@dataclass(frozen=True, kw_only=True)
class LossConfig:
    """The loss's knobs: the same-named keys of `[learner]` (learner/config.py documents
    them and holds their defaults; `learner.config.configure(LossConfig, section)` builds
    one), plus `correction`, which is no setting."""

    clip_eps: float
    clip_eps_high: float | None
    is_cap: float
    seq_mask_low: float
    seq_mask_high: float
    token_mask_low: float
    token_mask_high: float
    kl_coef: float
    entropy_coef: float
    rwl_coef: float
    rwl_beta: float
    rwl_max_weight: float
    correction: bool = True
    """False: treat behaviour data as on-policy (w = 1, no masking); for comparisons only."""


@dataclass
class LossInputs:
    logp: Tensor
    """log pi_theta of each target token (requires grad)."""
    mask: Tensor
    """1 where the token is trained on."""
    advantages: Tensor
    """[B] advantage of each sequence."""
    behaviour_logp: Tensor
    """log mu of each target token (ignored in rows without behaviour)."""
    has_behaviour: Tensor
    """[B] bool: the row carries behaviour logprobs."""
    proximal_logp: Tensor | None = None
    """log pi_prox; None: logp detached (one update per batch)."""
    ref_logp: Tensor | None = None
    """log pi_ref for the KL term."""
    entropy: Tensor | None = None
    """Entropy of pi_theta at each position for the entropy term."""


@dataclass
class LossStats:
    """Sums and counts, so micro-batches aggregate exactly; `means()` for logging."""

    sums: dict[str, float] = field(default_factory=dict)
    maxima: dict[str, float] = field(default_factory=dict)

    def add(self, key: str, value: float) -> None:
        self.sums[key] = self.sums.get(key, 0.0) + value

    def top(self, key: str, value: float) -> None:
        self.maxima[key] = max(self.maxima.get(key, -math.inf), value)

    def merge(self, other: LossStats) -> None:
        for k, v in other.sums.items():
            self.add(k, v)
        for k, v in other.maxima.items():
            self.top(k, v)

    def means(self) -> dict[str, float]:
        s, n_is, n_seq = self.sums, self.sums.get("is_tokens", 0.0), self.sums.get("is_seqs", 0.0)
        tok = max(s.get("tokens", 0.0), 1.0)

        def per(key: str, n: float) -> float:
            return s.get(key, 0.0) / n if n else 0.0

        out = {
            "loss": s.get("loss", 0.0),
            "pg_loss": s.get("pg_loss", 0.0),
            "rwl_loss": s.get("rwl_loss", 0.0),
            "ratio_mean": per("ratio", n_is),
            "is_weight_mean": per("is_weight", n_is),
            "clip_frac": per("clipped", n_is),
            "trunc_frac": per("truncated", n_is),
            "masked_seq_frac": per("masked_seqs", n_seq),
            "kl": s.get("kl", 0.0) / tok,
            "entropy": s.get("entropy", 0.0) / tok,
            "tokens": s.get("tokens", 0.0),
        }
        out.update({f"{k}_max": v for k, v in self.maxima.items()})
        return out


def _sequence_keep(log_w: Tensor, valid: Tensor, cfg: LossConfig) -> Tensor:
    """[B] bool: sequences whose importance weights are not extreme."""
    n = valid.sum(-1).clamp(min=1)
    geo = torch.exp((log_w * valid).sum(-1) / n)
    lo, hi = math.log(cfg.token_mask_low), math.log(cfg.token_mask_high)
    token_bad = ((log_w < lo) | (log_w > hi)) & valid.bool()
    return (geo >= cfg.seq_mask_low) & (geo <= cfg.seq_mask_high) & ~token_bad.any(-1)


def _importance(
    prox: Tensor, behaviour: Tensor, valid: Tensor, cfg: LossConfig
) -> tuple[Tensor, Tensor, Tensor]:
    """Truncated weight pi_prox / mu per token, [B, 1] sequence keep mask, raw log weight."""
    log_w = (prox - behaviour).clamp(-30.0, 30.0) * valid
    if not cfg.correction:
        return torch.ones_like(prox), torch.ones_like(prox[:, :1]), log_w
    weight = torch.exp(log_w).clamp(max=cfg.is_cap)
    return weight, _sequence_keep(log_w, valid, cfg).float()[:, None], log_w


def _clipped_surrogate(
    logp: Tensor, prox: Tensor, adv: Tensor, cfg: LossConfig
) -> tuple[Tensor, Tensor]:
    """min(r * A, clip(r) * A) per token with r = pi_theta / pi_prox, and where clipping bit."""
    ratio = torch.exp(logp - prox)
    eps_hi = cfg.clip_eps_high if cfg.clip_eps_high is not None else cfg.clip_eps
    clipped = torch.clamp(ratio, 1.0 - cfg.clip_eps, 1.0 + eps_hi)
    clip_active = (clipped * adv < ratio * adv).detach()
    return torch.where(clip_active, clipped * adv, ratio * adv), clip_active


def policy_loss(
    inp: LossInputs, cfg: LossConfig, num_tokens: float | None = None
) -> tuple[Tensor, LossStats]:
    """The loss to minimise (a scalar) and its statistics. See the module docstring."""
    mask = inp.mask.float()
    has_b = inp.has_behaviour.bool()
    valid = mask * has_b[:, None].float()
    denom = float(num_tokens) if num_tokens else max(float(mask.sum()), 1.0)
    adv = inp.advantages.float()[:, None]
    logp = inp.logp.float()
    prox = (inp.proximal_logp if inp.proximal_logp is not None else logp).detach().float()
    behaviour = torch.where(valid.bool(), inp.behaviour_logp.float(), prox)

    weight, keep, log_w = _importance(prox, behaviour, valid, cfg)
    surrogate, clip_active = _clipped_surrogate(logp, prox, adv, cfg)
    pg = -(weight * surrogate * valid * keep).sum()
    rwl_w = torch.exp(adv / cfg.rwl_beta).clamp(max=cfg.rwl_max_weight)
    rwl = -cfg.rwl_coef * (rwl_w * logp * mask * (~has_b)[:, None].float()).sum()
    zero = logp.new_zeros(())
    kl, ent = zero, zero
    if inp.ref_logp is not None and cfg.kl_coef:
        q = inp.ref_logp.float().detach() - logp
        kl = ((torch.exp(q) - q - 1.0) * mask).sum()
    if inp.entropy is not None:
        ent = (inp.entropy.float() * mask).sum()
    loss = (pg + rwl + cfg.kl_coef * kl - cfg.entropy_coef * ent) / denom

    with torch.no_grad():
        rho = torch.exp((logp - behaviour).clamp(-30.0, 30.0))
        values = {
            "loss": loss,
            "pg_loss": pg / denom,
            "rwl_loss": rwl / denom,
            "kl": kl,
            "entropy": ent,
            "tokens": mask.sum(),
            "is_tokens": valid.sum(),
            "is_seqs": has_b.sum(),
            "ratio": (rho * valid).sum(),
            "is_weight": (weight * valid).sum(),
            "clipped": (clip_active.float() * valid).sum(),
            "truncated": ((torch.exp(log_w) > cfg.is_cap).float() * valid).sum(),
            "masked_seqs": ((1.0 - keep[:, 0]) * has_b.float()).sum(),
            "ratio_top": torch.where(valid.bool(), rho, zero).max() if rho.numel() else zero,
        }
        flat = torch.stack([v.detach().float() for v in values.values()]).tolist()  # one sync
    stats = LossStats()
    for key, value in zip(values, flat, strict=True):
        if key == "ratio_top":
            if value > 0:
                stats.top("ratio", value)
        else:
            stats.add(key, value)
    return loss, stats
