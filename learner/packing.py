"""What the decoder (learner/decode.py) packs from a model: the weight a linear layer applies
(its LoRA deltas merged), the frozen base apart from the adapters (peft keeps it in
``base_layer``), and the adapters as the factors of one low-rank term per fused matrix."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn


def effective_weight(linear: nn.Module) -> Tensor:
    """The weight a (possibly LoRA-wrapped, peft) linear layer applies: W + sum of deltas."""
    base = getattr(linear, "base_layer", None)
    if base is None:
        return linear.weight.detach()  # type: ignore[operator]
    weight = base.weight.detach()
    if getattr(linear, "merged", False):
        return weight  # type: ignore[no-any-return]
    for name in getattr(linear, "active_adapters", []):
        if name in getattr(linear, "lora_A", {}):
            delta: Tensor = getattr(linear, "get_delta_weight")(name)  # noqa: B009
            weight = weight + delta.detach()
    return weight  # type: ignore[no-any-return]


def base_weight(linear: nn.Module) -> Tensor:
    """The weight of a linear layer without its LoRA adapters (peft keeps it in
    ``base_layer``; merged adapters are in it)."""
    base: Any = getattr(linear, "base_layer", linear)
    return base.weight.detach()  # type: ignore[no-any-return]


def lora_factors(linears: Sequence[Any]) -> tuple[Tensor, Tensor] | None:
    """``(down, up)`` of `quant.LowRank` for the fused matrix of ``linears`` (stacked
    in that order): each active, unmerged adapter's A, and its B times its scaling in its
    own rows and columns. None without adapters."""
    downs, blocks, rows = [], [], 0
    for linear in linears:
        out = base_weight(linear).shape[0]
        if not getattr(linear, "merged", False):
            for name in getattr(linear, "active_adapters", []):
                if name in getattr(linear, "lora_A", {}):
                    if getattr(linear, "use_dora", {}).get(name):
                        raise ValueError("int4 sampling: DoRA adapters are not supported")
                    a = linear.lora_A[name].weight.detach()
                    b = linear.lora_B[name].weight.detach() * linear.scaling[name]
                    downs.append(a)
                    blocks.append((rows, b))
        rows += out
    if not downs:
        return None
    down = torch.cat(downs).float()
    up = torch.zeros(rows, down.shape[0], dtype=torch.float32, device=down.device)
    col = 0
    for row, b in blocks:
        up[row : row + b.shape[0], col : col + b.shape[1]] = b
        col += b.shape[1]
    return down, up


def weights_version(model: nn.Module) -> int:
    """Changes whenever a parameter is modified in place (optimizer step, load_state_dict)."""
    return sum(int(getattr(p, "_version", 0)) for p in model.parameters())
