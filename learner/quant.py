"""Weight-only quantized linear layers for sampling on a CPU (learner/decode.py).

A decoding step at batch 8 reads every weight once and does little arithmetic with it, so
on a CPU its time is mostly the matmul kernels streaming weights. Fewer bytes per weight
make it faster where the kernel keeps up: with torch's int4 weight-only CPU kernel
(`_weight_int4pack_mm_for_cpu`, bf16 activations) a SmolLM2 decoding step at batch 8 took
about 39 ms against about 85 ms in float32 on a 2-core Intel Xeon without native bf16
(benchmarks/generation.py).

- `Int4`: groups of `GROUP` (32) weights along the input dimension, 16 levels each, an
  asymmetric grid (w = scale * q + min; torch's kernel takes it as (q - 8) * scale + zero
  with zero = min + 8 * scale, both in bf16). The GGUF file SmolLM2 ships is Q4_1 (the same
  grid, 32-weight blocks) for every layer, so its converted weights are on this grid:
  `off_grid` measures how far a weight matrix is from it (0 for those layers), and
  `learner.sample_dtype = "auto"` uses int4 only where that is (about) 0.
- `Int8Rows`: int8 with one scale per output row, for the LM head (SmolLM2's embedding,
  tied to the head, is not on a 4-bit grid).
- `Dense`: plain `F.linear` (what `Decoder` uses without quantization, and for a matrix
  whose shape the int4 kernel does not take: N a multiple of 16, K of `GROUP`).
- `LowRank`: a quantized base plus LoRA adapters applied as two thin matmuls, so a LoRA
  update reaches the sampler exactly (merging it into 4-bit weights would round it away:
  a step's change is far below a 4-bit grid's spacing).

The arithmetic is the kernel's: activations are cast to bf16 at each quantized matmul
(a no-op where they are bf16 already), and its output stays bf16 (the next op promotes
it; a cast back costs more than the op at these sizes). The sampled tokens' behaviour
logprobs are those of this arithmetic, and the learner's importance correction handles
their difference from its own forward (benchmarks/generation.py prints it: about as
large as bf16 sampling's). Not used: fbgemm's dynamic int8 linear for the head, 10%
faster per step but quantizing the activations too nearly doubled that difference.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

GROUP = 32
"""Weights per int4 group (GGUF's Q4_1 block size)."""
ON_GRID = 1e-4
"""`off_grid` below this (in units of a group's grid spacing) counts as on the int4 grid."""


def available() -> bool:
    """Whether this torch has the int4 / int8 weight-only CPU kernels."""
    ops = torch.ops.aten
    return all(
        hasattr(ops, name)
        for name in ("_convert_weight_to_int4pack_for_cpu", "_weight_int4pack_mm_for_cpu",
                     "_weight_int8pack_mm")
    )  # fmt: skip


def int4_fits(n: int, k: int) -> bool:
    """Whether the int4 kernel takes an ``[N, K]`` matrix."""
    return n % 16 == 0 and k % GROUP == 0


def int4_grid(weight: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Levels ``q`` (int32 0..15, ``[N, K]``), ``scale`` and ``low`` (float32
    ``[N, K / GROUP]``) of each group's 16-level grid from its min to its max."""
    n, k = weight.shape
    w = weight.detach().float().reshape(n, k // GROUP, GROUP)
    low, high = w.amin(-1), w.amax(-1)
    scale = ((high - low) / 15).clamp(min=1e-12)
    q = ((w - low[..., None]) / scale[..., None]).round().clamp(0, 15)
    return q.to(torch.int32).reshape(n, k), scale, low


def off_grid(weight: Tensor) -> float:
    """The largest distance of a weight from its group's int4 grid, in grid spacings
    (0: every weight is exactly a level; 0.5 at most)."""
    n, k = weight.shape
    q, scale, low = int4_grid(weight)
    w = weight.detach().float().reshape(n, k // GROUP, GROUP)
    back = q.reshape(n, k // GROUP, GROUP) * scale[..., None] + low[..., None]
    return float(((w - back).abs() / scale[..., None]).max()) if w.numel() else 0.0


@dataclass
class Dense:
    weight: Tensor

    def __call__(self, x: Tensor) -> Tensor:
        return F.linear(x, self.weight)


@dataclass
class Int4:
    packed: Tensor
    scales_zeros: Tensor
    out_features: int

    @classmethod
    def of(cls, weight: Tensor) -> Int4:
        q, scale, low = int4_grid(weight)
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1)
        zero = low + 8 * scale
        sz = torch.stack([scale, zero], -1).transpose(0, 1).contiguous().to(torch.bfloat16)
        return cls(packed, sz, int(weight.shape[0]))

    def dequantized(self) -> Tensor:
        """The float32 ``[N, K]`` matrix this computes with (for tests)."""
        k = self.scales_zeros.shape[0] * GROUP
        return self(torch.eye(k, dtype=torch.float32)).float().T.contiguous()

    def __call__(self, x: Tensor) -> Tensor:
        flat = x.reshape(-1, x.shape[-1]).to(torch.bfloat16)
        y: Tensor = torch.ops.aten._weight_int4pack_mm_for_cpu(
            flat, self.packed, GROUP, self.scales_zeros
        )
        return y.reshape(*x.shape[:-1], self.out_features)


@dataclass
class Int8Rows:
    q: Tensor
    scale: Tensor

    @classmethod
    def of(cls, weight: Tensor) -> Int8Rows:
        w = weight.detach().float()
        scale = (w.abs().amax(1) / 127).clamp(min=1e-12)
        q = (w / scale[:, None]).round().clamp(-127, 127).to(torch.int8)
        return cls(q, scale.to(torch.bfloat16))

    def __call__(self, x: Tensor) -> Tensor:
        flat = x.reshape(-1, x.shape[-1]).to(torch.bfloat16)
        y: Tensor = torch.ops.aten._weight_int8pack_mm(flat, self.q, self.scale)
        return y.reshape(*x.shape[:-1], self.q.shape[0])


@dataclass
class LowRank:
    """``base(x) + x A^T B^T``: ``down`` (A, ``[R, K]``) and ``up`` (B times the LoRA
    scaling, ``[N, R]``) of every adapter of the fused matrix, block-stacked."""

    base: Dense | Int4
    down: Tensor
    up: Tensor

    def __call__(self, x: Tensor) -> Tensor:
        return self.base(x) + F.linear(F.linear(x.to(self.down.dtype), self.down), self.up)


Linear = Dense | Int4 | Int8Rows | LowRank
"""What `Decoder` applies for each weight matrix."""
