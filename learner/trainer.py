"""One learner update: micro-batched forward/backward of the loss, optimizer step.

No Kafka here: the service loop (learner/loop.py) feeds batches, and tests and benchmarks
drive it directly. CUDA when available, CPU otherwise, on the same code path; bf16 autocast
where the device supports it (logprobs and the loss are always computed in float32).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from learner.batching import micro_batches, prefix_micro_batches, split_even
from learner.config import LearnerSettings, configure
from learner.cpu import fast_bf16_cpu
from learner.loss import LossConfig, LossInputs, LossStats, policy_loss
from learner.policy import Policy
from learner.sample import Sample, collate


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """The trainer's knobs: the same-named keys of `[learner]` (learner/config.py documents
    them and holds their defaults; `train_config(section)` builds one), plus `betas`."""

    lr: float
    weight_decay: float
    grad_clip: float
    micro_batch_tokens: int
    minibatches: int
    temperature: float
    amp: bool
    cpu_amp: bool
    share_prompt: bool
    loss: LossConfig
    betas: tuple[float, float] = (0.9, 0.999)
    """AdamW betas (no setting)."""


def train_config(section: LearnerSettings) -> TrainConfig:
    """The trainer's and the loss's knobs from the `[learner]` section."""
    return configure(TrainConfig, section, loss=configure(LossConfig, section))


@dataclass
class StepResult:
    steps: int
    """Optimizer steps taken."""
    stats: dict[str, float]
    tokens: int
    """Sequence tokens processed (prompt + completion)."""
    seconds: float


def pick_device(name: str = "auto") -> torch.device:
    """`auto`: the first CUDA device when there is one, else the CPU."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def autocast_dtype(device: torch.device, amp: bool, cpu_amp: bool = False) -> torch.dtype | None:
    """bf16 where the device computes in it natively (on a CPU: and measured faster than
    float32, `fast_bf16_cpu`) and the settings ask for it."""
    if amp and device.type == "cuda" and torch.cuda.is_bf16_supported():
        return torch.bfloat16
    if cpu_amp and device.type == "cpu" and fast_bf16_cpu():
        return torch.bfloat16
    return None


class Trainer:
    def __init__(
        self,
        policy: Policy,
        cfg: TrainConfig,
        device: torch.device | None = None,
        ref_policy: Policy | None = None,
    ) -> None:
        self.cfg = cfg
        self.device = device or pick_device()
        self.policy = policy
        policy.to(self.device)
        policy.train()
        self._wrap()
        self.ref_policy = ref_policy
        if ref_policy is not None:
            ref_policy.to(self.device)
            ref_policy.train(False)
        self.optimizer = torch.optim.AdamW(
            list(policy.trainable_parameters()),
            lr=cfg.lr,
            betas=cfg.betas,
            weight_decay=cfg.weight_decay,
        )
        self.amp_dtype = autocast_dtype(self.device, cfg.amp, cfg.cpu_amp)
        self.steps = 0

    def _wrap(self) -> None:
        """Hook between placing the policy and building its optimizer (learner/parallel.py
        shards it there)."""

    def _autocast(self) -> torch.autocast:
        return torch.autocast(
            self.device.type, dtype=self.amp_dtype or torch.float32, enabled=bool(self.amp_dtype)
        )

    def _logprobs(
        self, policy: Policy, tokens: Tensor, attn: Tensor, entropy: bool, shared: int = 0
    ) -> tuple[Tensor, Tensor | None]:
        with self._autocast():
            return policy.token_logprobs(
                tokens, attn, temperature=self.cfg.temperature, with_entropy=entropy,
                shared_prefix=shared,
            )  # fmt: skip

    def _micro_batches(self, samples: Sequence[Sample]) -> list[list[int]]:
        """Index groups of one forward/backward each; with `share_prompt`, one prompt each."""
        lengths = [s.length for s in samples]
        if not self.cfg.share_prompt:
            return micro_batches(lengths, self.cfg.micro_batch_tokens)
        keys = [s.prompt.tobytes() for s in samples]
        prompt_lens = [len(s.prompt) for s in samples]
        return prefix_micro_batches(lengths, keys, prompt_lens, self.cfg.micro_batch_tokens)

    def _shared(self, rows: Sequence[Sample]) -> int:
        """The prompt length when every row has the same prompt (and sharing is on), else 0."""
        if not self.cfg.share_prompt or len(rows) < 2:
            return 0
        first = rows[0].prompt
        same = all(np.array_equal(r.prompt, first) for r in rows[1:])
        return len(first) if same else 0

    @torch.no_grad()
    def _proximal(self, samples: Sequence[Sample]) -> list[Tensor]:
        """log pi_prox of every target token, per sample, before this batch's updates."""
        out: list[Tensor] = [torch.empty(0)] * len(samples)
        for group in self._micro_batches(samples):
            rows = [samples[i] for i in group]
            batch = collate(rows, self.policy.pad_id, self.device)
            shared = self._shared(rows)
            logp, _ = self._logprobs(self.policy, batch.tokens, batch.attention_mask, False, shared)
            for row, i in enumerate(group):
                out[i] = logp[row, : samples[i].length - 1]
        return out

    def _update(self, samples: Sequence[Sample], prox: list[Tensor] | None) -> LossStats:
        self.optimizer.zero_grad(set_to_none=True)
        num_tokens = float(sum(s.trained_tokens for s in samples))
        groups = self._micro_batches(samples)
        stats = LossStats()
        for group in groups:
            stats.merge(self._backward(samples, group, prox, num_tokens))
        return self._apply(stats)

    def _backward(
        self,
        samples: Sequence[Sample],
        group: list[int],
        prox: list[Tensor] | None,
        num_tokens: float,
    ) -> LossStats:
        """Forward and backward of one micro-batch; gradients accumulate."""
        want_entropy = self.cfg.loss.entropy_coef > 0
        rows = [samples[i] for i in group]
        batch = collate(rows, self.policy.pad_id, self.device)
        tokens, attn, shared = batch.tokens, batch.attention_mask, self._shared(rows)
        logp, ent = self._logprobs(self.policy, tokens, attn, want_entropy, shared)
        ref = None
        if self.ref_policy is not None and self.cfg.loss.kl_coef:
            with torch.no_grad():
                ref, _ = self._logprobs(self.ref_policy, tokens, attn, False, shared)
        prox_t = None
        if prox is not None:
            prox_t = torch.nn.utils.rnn.pad_sequence([prox[i] for i in group], batch_first=True)
            prox_t = torch.nn.functional.pad(prox_t, (0, logp.shape[1] - prox_t.shape[1]))
        inputs = LossInputs(
            logp=logp,
            mask=batch.loss_mask,
            advantages=batch.advantages,
            behaviour_logp=batch.behaviour_logp,
            has_behaviour=batch.has_behaviour,
            proximal_logp=prox_t,
            ref_logp=ref,
            entropy=ent,
        )
        loss, stats = policy_loss(inputs, self.cfg.loss, num_tokens=num_tokens)
        loss.backward()  # type: ignore[no-untyped-call]
        return stats

    def _apply(self, stats: LossStats) -> LossStats:
        """Clip the accumulated gradients and take the optimizer step."""
        params = [p for g in self.optimizer.param_groups for p in g["params"]]
        norm = torch.nn.utils.clip_grad_norm_(params, self.cfg.grad_clip)
        self.optimizer.step()
        self.steps += 1
        stats.add("grad_norm", float(norm))
        return stats

    def weights(self) -> dict[str, Tensor]:
        """The full weights, on the CPU (what a publication stores)."""
        return self.policy.weights()

    def step(self, samples: Sequence[Sample]) -> StepResult:
        """Train on one batch: ``cfg.minibatches`` optimizer steps over it."""
        if not samples:
            raise ValueError("Trainer.step: empty batch")
        started = time.perf_counter()
        minis = split_even(list(range(len(samples))), self.cfg.minibatches)
        prox = self._proximal(samples) if len(minis) > 1 else None
        stats = LossStats()
        for mini in minis:
            stats.merge(
                self._update([samples[i] for i in mini], [prox[i] for i in mini] if prox else None)
            )
        if self.device.type == "cpu":
            release_free_heap()
        means = stats.means()
        for key in ("loss", "pg_loss", "rwl_loss"):
            means[key] /= len(minis)
        means["grad_norm"] = stats.sums["grad_norm"] / len(minis)
        means["reward_mean"] = float(np.mean([s.reward for s in samples]))
        means["advantage_mean"] = float(np.mean([s.advantage for s in samples]))
        means["samples"] = float(len(samples))
        means["lr"] = float(self.optimizer.param_groups[0]["lr"])
        return StepResult(
            steps=len(minis),
            stats=means,
            tokens=sum(s.length for s in samples),
            seconds=time.perf_counter() - started,
        )


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    try:
        trim: Callable[[int], int] | None = (
            getattr(ctypes.CDLL(name), "malloc_trim", None) if name else None
        )
    except OSError:
        return None
    return trim


def release_free_heap() -> None:
    """Hand the C heap's free pages back to the OS (glibc's `malloc_trim`; a no-op where
    there is none). A CPU step allocates activations of a different shape every batch, and
    glibc kept what they freed: the demo's learner grew from 7 to 10 GB of RSS over 13 steps.
    Trimmed after each step, the pages come back the next step (a few ms of page faults)."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)
