"""The decoder's KV cache and attention (learner/decode.py): a static cache per layer, read
through views of its written positions, and the left padding of a batch of different
prompts (`Padding`), which gives each row its own positions and hides its pad columns."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import Tensor


class Shape(Protocol):
    """What a cache is sized from (a `learner.decode.Decoder`)."""

    kv_heads: int
    head_dim: int
    dtype: torch.dtype
    device: torch.device

    @property
    def depth(self) -> int: ...

    def rope(self, length: int) -> tuple[Tensor, Tensor]: ...


class Padding:
    """Left padding of a batch of different prompts: row ``r``'s prompt starts at column
    ``pads[r]`` of the cache. Each row's positions (rotary) count from its first real
    token, and every attention hides its pad columns, so a row decodes as it would alone."""

    def __init__(self, pads: Sequence[int], length: int, device: torch.device) -> None:
        self.pads = torch.tensor(list(pads), dtype=torch.long, device=device)
        cols = torch.arange(length, device=device)
        self.real = cols[None] >= self.pads[:, None]  # [B, L]: a real token's column
        bias = torch.zeros(self.real.shape, dtype=torch.float32, device=device)
        self.bias = bias.masked_fill(~self.real, float("-inf"))[:, None, None]  # [B,1,1,L]
        self._mask: Tensor | None = None  # the prompt's mask, built once for all layers

    def positions(self, start: int, t: int) -> Tensor:
        """``[B, T]``: the rotary positions of cache columns ``start .. start+t-1``."""
        cols = torch.arange(start, start + t, device=self.pads.device)
        return (cols[None] - self.pads[:, None]).clamp(min=0)

    def prompt_mask(self, t: int) -> Tensor:
        """``[B, 1, T, T]`` (True: attends): causal over real columns; a pad column attends
        to itself only (its output is never read; a row of nothing would be NaN). Built once
        per prompt (every layer asks for it)."""
        if self._mask is not None and self._mask.shape[-1] == t:
            return self._mask
        causal = torch.ones(t, t, dtype=torch.bool, device=self.pads.device).tril()
        eye = torch.eye(t, dtype=torch.bool, device=self.pads.device)
        self._mask = ((causal[None] & self.real[:, None, :t]) | eye[None])[:, None]
        return self._mask

    def keep(self, rows: Tensor) -> None:
        self.pads = self.pads.index_select(0, rows)
        self.real = self.real.index_select(0, rows)
        self.bias = self.bias.index_select(0, rows)
        self._mask = None


class KVCache:
    """Static keys ``[rows, kv_heads, head_dim, length]`` (transposed: what the scores'
    matmul takes as is) and values ``[rows, kv_heads, length, head_dim]`` per layer;
    attention reads the written positions only (views, no copy). ``pads``: the left
    padding of each row's prompt (`Padding`), for a batch of different prompts."""

    def __init__(
        self, dec: Shape, rows: int, length: int, pads: Sequence[int] | None = None
    ) -> None:
        kt = (rows, dec.kv_heads, dec.head_dim, length)
        vs = (rows, dec.kv_heads, length, dec.head_dim)
        self.k = [torch.zeros(kt, dtype=dec.dtype, device=dec.device) for _ in range(dec.depth)]
        self.v = [torch.zeros(vs, dtype=dec.dtype, device=dec.device) for _ in range(dec.depth)]
        self.cos, self.sin = dec.rope(length)
        self.padding = Padding(pads, length, dec.device) if pads is not None else None

    def rotary(self, pos: int, t: int) -> tuple[Tensor, Tensor]:
        """cos and sin for columns ``pos .. pos+t-1``, broadcasting over ``[B, H, T, D]``."""
        if self.padding is None:
            return self.cos[pos : pos + t][None, None], self.sin[pos : pos + t][None, None]
        at = self.padding.positions(pos, t)
        return self.cos[at][:, None], self.sin[at][:, None]

    def write(self, layer: int, pos: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Store ``k``, ``v`` ``[B, kv_heads, T, head_dim]`` at ``pos``; what `attend`
        attends over: the prompt itself (pos 0), else the layer's positions up to ``pos``."""
        end = pos + k.shape[2]
        self.k[layer][:, :, :, pos:end] = k.transpose(-1, -2)  # a batch-1 prompt broadcasts
        self.v[layer][:, :, pos:end] = v
        if pos == 0:  # the prompt attends to itself (one row for the whole group)
            v = v.to(self.v[layer].dtype)  # an int4 matmul's output is bf16
            return (k, v) if k.shape[2] > 1 else (k.transpose(-1, -2), v)  # 1 token: a step
        return self.k[layer][..., :end], self.v[layer][:, :, :end]

    def attend(self, q: Tensor, keys: Tensor, values: Tensor) -> Tensor:
        """`attend` with this cache's padding, if any."""
        if self.padding is None:
            return attend(q, keys, values)
        t = q.shape[2]
        if t > 1:
            return attend(q, keys, values, mask=self.padding.prompt_mask(t))
        return attend(q, keys, values, bias=self.padding.bias[..., : values.shape[2]])

    def keep(self, rows: Tensor) -> None:
        """Drop every row but ``rows`` (finished sequences leave the batch)."""
        self.k = [c.index_select(0, rows) for c in self.k]
        self.v = [c.index_select(0, rows) for c in self.v]
        if self.padding is not None:
            self.padding.keep(rows)


def attend(
    q: Tensor, keys: Tensor, values: Tensor, *, mask: Tensor | None = None,
    bias: Tensor | None = None,
) -> Tensor:  # fmt: skip
    """Causal attention of ``q`` ``[B, Hq, T, D]`` (grouped-query: Hq a multiple of the kv
    heads Hk). A prompt (T > 1, ``keys``/``values`` ``[B, Hk, T, D]``): the fused kernel,
    causal or under ``mask``. One new token per row: over every written position
    (KVCache's layout: ``keys`` ``[B, Hk, D, P]``, ``values`` ``[B, Hk, P, D]``, views of
    the static cache), plus ``bias`` ``[B, 1, 1, P]`` (-inf at pad columns) if given: two
    batched matmuls and a softmax, each kv head's query heads side by side. CPU's fused
    kernel costs about 0.35 ms per layer at this size; attending over the whole static
    cache with a mask made a step about 2.5% slower at 128 new tokens."""
    b, hq, t, d = q.shape
    if t > 1:
        if mask is None:
            return F.scaled_dot_product_attention(q, keys, values, is_causal=True, enable_gqa=True)
        return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, enable_gqa=True)
    hk = keys.shape[1]
    grouped = q.reshape(b, hk, hq // hk, d)  # the query heads that share a kv head
    scores = torch.matmul(grouped, keys).float() * (d**-0.5)
    if bias is not None:
        scores = scores + bias
    weights = torch.softmax(scores, dim=-1).to(values.dtype)
    return torch.matmul(weights, values).reshape(b, hq, 1, d)


def rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotary embedding, as transformers' `x * cos + rotate_half(x) * sin`, with the sign of
    rotate_half's negated half folded into ``sin`` (Decoder.rope): one roll, no cat."""
    return x * cos + x.roll(x.shape[-1] // 2, dims=-1) * sin
