"""Fast batched decoding for Llama-family Hugging Face models (SmolLM2, Llama ...), on CPU
or GPU.

`transformers`' own forward spends most of a decoding step in Python (module calls, cache
objects, masks) and computes logits for every prompt position. `Decoder` runs the same
arithmetic as `LlamaForCausalLM` with less around it:

- the weights are packed once per weight version (q/k/v and gate/up fused into one matrix
  each, LoRA deltas merged) in the sampling dtype (bf16 halves the bytes a memory-bound
  decoding step reads; this CPU has avx512_bf16);
- a static KV cache, allocated for prompt + max_new_tokens;
- a group shares its prompt: the prompt is run once (batch 1) and its cache copied to the
  ``n`` rows; logits only for the last position;
- finished rows (end-of-sequence, a stop string, see learner/stops.py) are dropped from the
  batch, so the tail of a group costs what its live rows cost;
- few ops per layer: q and k rotated together, a decoding step's attention as two matmuls
  over the whole (masked) static cache, tokens drawn by inverse transform sampling
  (`learner.sampling.draw`; torch.multinomial spent 8 ms a step on the 49k vocabulary).
  At batch 8 on 2 CPU cores a step is then mostly the read of the bf16 weights (270 MB:
  the matmuls alone take ~29 ms of a ~37 ms step).

In-flight weight updates: ``between_steps`` (learner/sampling.py) is called between two
decoding steps, as in `learner.sampling.sample`; when it loads newer weights (returns their
version), ``repack`` gives the decoder over them and the following steps use it (the KV
cache of the tokens before stays as computed). Each token records the version it was drawn
under.

Behaviour logprobs are those of the distribution each token was drawn from, computed from
these logits (temperature, then top-p: `learner.sampling.nucleus_logprobs`): with bf16
sampling weights they differ from a float32 learner's recomputation by the bf16 rounding,
which the learner's importance correction (learner/loss.py) handles like any other
behaviour/target mismatch. `benchmarks/generation.py` measures speed and that mismatch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from learner.sampling import BetweenSteps, Completion, draw, nucleus_logprobs
from learner.stops import StopStrings

SUPPORTED = frozenset({"llama"})
"""`config.model_type`s whose forward `Decoder` reproduces."""


def supports(model: Any) -> bool:
    cfg = getattr(model, "config", None)
    return getattr(cfg, "model_type", None) in SUPPORTED and not getattr(cfg, "rope_scaling", None)


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


@dataclass
class _Layer:
    ln1: Tensor
    qkv: Tensor
    o: Tensor
    ln2: Tensor
    gate_up: Tensor
    down: Tensor


def weights_version(model: nn.Module) -> int:
    """Changes whenever a parameter is modified in place (optimizer step, load_state_dict)."""
    return sum(int(getattr(p, "_version", 0)) for p in model.parameters())


class Decoder:
    """Packed weights of one `LlamaForCausalLM` (or peft wrapping one) in ``dtype``."""

    def __init__(self, model: Any, dtype: torch.dtype) -> None:
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        cfg = base.config
        self.dtype = dtype
        self.heads = int(cfg.num_attention_heads)
        self.kv_heads = int(getattr(cfg, "num_key_value_heads", None) or self.heads)
        self.head_dim = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // self.heads)
        self.eps = float(cfg.rms_norm_eps)
        self.version = weights_version(model)
        with torch.no_grad():
            self._pack(base, dtype)
        rotary = base.model.rotary_emb
        self.inv_freq = rotary.inv_freq.detach().float()
        self.rope_scale = float(getattr(rotary, "attention_scaling", 1.0))
        self.device = self.embed.device

    def _pack(self, base: Any, dtype: torch.dtype) -> None:
        def cast(t: Tensor) -> Tensor:
            return t.detach().to(dtype).contiguous()

        inner = base.model
        self.embed = cast(inner.embed_tokens.weight)
        head = effective_weight(base.lm_head)
        self.head = self.embed if head.data_ptr() == inner.embed_tokens.weight.data_ptr() else (
            cast(head)
        )  # fmt: skip
        self.norm = cast(inner.norm.weight)
        self.layers = []
        for layer in inner.layers:
            att, mlp = layer.self_attn, layer.mlp
            qkv = [effective_weight(m) for m in (att.q_proj, att.k_proj, att.v_proj)]
            gate_up = [effective_weight(m) for m in (mlp.gate_proj, mlp.up_proj)]
            self.layers.append(_Layer(
                ln1=cast(layer.input_layernorm.weight), qkv=cast(torch.cat(qkv)),
                o=cast(effective_weight(att.o_proj)),
                ln2=cast(layer.post_attention_layernorm.weight),
                gate_up=cast(torch.cat(gate_up)), down=cast(effective_weight(mlp.down_proj)),
            ))  # fmt: skip

    def rope(self, length: int) -> tuple[Tensor, Tensor]:
        pos = torch.arange(length, device=self.device, dtype=torch.float32)
        freqs = torch.outer(pos, self.inv_freq.to(self.device))
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos() * self.rope_scale, emb.sin() * self.rope_scale
        half = sin.shape[-1] // 2
        sin[..., :half] = -sin[..., :half]  # _rotate's sign, folded in once
        return cos.to(self.dtype), sin.to(self.dtype)

    def _rms(self, x: Tensor, weight: Tensor) -> Tensor:
        """LlamaRMSNorm (float32 inside; one fused op instead of seven)."""
        return F.rms_norm(x, (x.shape[-1],), weight, self.eps)

    def forward(self, tokens: Tensor, pos: int, cache: KVCache) -> Tensor:
        """Logits ``[B, V]`` (float32) of the token after ``tokens`` ``[B, T]``, which sit
        at positions ``pos .. pos+T-1``; their keys and values are written to ``cache``."""
        b, t = tokens.shape
        hd, nq, nk = self.head_dim, self.heads, self.kv_heads
        if t > 1 and pos:
            raise ValueError("Decoder.forward: several tokens only as the prompt (pos 0)")
        cos = cache.cos[pos : pos + t][None, None]
        sin = cache.sin[pos : pos + t][None, None]
        mask = cache.mask(pos + t)
        h = F.embedding(tokens, self.embed)
        for i, layer in enumerate(self.layers):
            qkv = F.linear(self._rms(h, layer.ln1), layer.qkv).view(b, t, nq + 2 * nk, hd)
            qk = _rotate(qkv[:, :, : nq + nk].transpose(1, 2), cos, sin)  # q and k at once
            q, k = qk[:, :nq], qk[:, nq:]
            keys, values = cache.write(i, pos, k, qkv[:, :, nq + nk :].transpose(1, 2))
            att = _attend(q, keys, values, mask)
            h = h + F.linear(att.transpose(1, 2).reshape(b, t, nq * hd), layer.o)
            gate, up = F.linear(self._rms(h, layer.ln2), layer.gate_up).chunk(2, dim=-1)
            h = h + F.linear(F.silu(gate) * up, layer.down)
        return F.linear(self._rms(h[:, -1], self.norm), self.head).float()


def _attend(q: Tensor, keys: Tensor, values: Tensor, mask: Tensor) -> Tensor:
    """Causal attention of ``q`` ``[B, Hq, T, D]`` (grouped-query: Hq a multiple of the kv
    heads Hk). A prompt (T > 1, ``keys``/``values`` ``[B, Hk, T, D]``): the fused kernel.
    One new token per row: over the whole static cache (KVCache's layout: ``keys``
    ``[B, Hk, D, L]``, ``values`` ``[B, Hk, L, D]``), positions not written yet masked
    out by ``mask`` (0 / -inf, ``[L]``): two batched matmuls on contiguous tensors (a
    slice of the cache is copied by every matmul) and a softmax, each kv head's query
    heads side by side. CPU's fused kernel costs about 0.35 ms per layer at this size."""
    b, hq, t, d = q.shape
    if t > 1:
        return F.scaled_dot_product_attention(q, keys, values, is_causal=True, enable_gqa=True)
    hk = keys.shape[1]
    grouped = q.reshape(b, hk, hq // hk, d)  # the query heads that share a kv head
    scores = torch.matmul(grouped, keys).float() * (d**-0.5) + mask
    weights = torch.softmax(scores, dim=-1).to(values.dtype)
    return torch.matmul(weights, values).reshape(b, hq, 1, d)


def _rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotary embedding, as transformers' `x * cos + rotate_half(x) * sin`, with the sign of
    rotate_half's negated half folded into ``sin`` (Decoder.rope): one roll, no cat."""
    return x * cos + x.roll(x.shape[-1] // 2, dims=-1) * sin


class KVCache:
    """Static keys ``[rows, kv_heads, head_dim, length]`` (transposed: what the scores'
    matmul takes as is) and values ``[rows, kv_heads, length, head_dim]`` per layer, zeros
    where nothing was written yet (masked out, and 0 x 0 in the values' matmul)."""

    def __init__(self, dec: Decoder, rows: int, length: int) -> None:
        kt = (rows, dec.kv_heads, dec.head_dim, length)
        vs = (rows, dec.kv_heads, length, dec.head_dim)
        self.k = [torch.zeros(kt, dtype=dec.dtype, device=dec.device) for _ in dec.layers]
        self.v = [torch.zeros(vs, dtype=dec.dtype, device=dec.device) for _ in dec.layers]
        self.cos, self.sin = dec.rope(length)
        self.positions = torch.arange(length, device=dec.device)

    def mask(self, end: int) -> Tensor:
        """0 for the positions before ``end``, -inf after (float32 ``[length]``)."""
        return torch.zeros(self.positions.shape, device=self.positions.device).masked_fill_(
            self.positions >= end, float("-inf")
        )

    def write(self, layer: int, pos: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Store ``k``, ``v`` ``[B, kv_heads, T, head_dim]`` at ``pos``; what `_attend`
        attends over: the prompt itself (pos 0), else the whole cache of the layer."""
        end = pos + k.shape[2]
        self.k[layer][:, :, :, pos:end] = k.transpose(-1, -2)  # a batch-1 prompt broadcasts
        self.v[layer][:, :, pos:end] = v
        if pos == 0:
            return k, v  # the prompt attends to itself (one row for the whole group)
        return self.k[layer], self.v[layer]

    def keep(self, rows: Tensor) -> None:
        """Drop every row but ``rows`` (finished sequences leave the batch)."""
        self.k = [c.index_select(0, rows) for c in self.k]
        self.v = [c.index_select(0, rows) for c in self.v]


@dataclass
class _Rows:
    tokens: list[list[int]]
    logprobs: list[list[float]]
    reasons: list[str]
    versions: list[list[int]]


@torch.no_grad()
def generate(
    dec: Decoder,
    prompt_ids: Sequence[int],
    n: int,
    *,
    max_new_tokens: int,
    eos_id: int,
    temperature: float = 1.0,
    top_p: float = 1.0,
    generator: torch.Generator | None = None,
    stops: StopStrings | None = None,
    between_steps: BetweenSteps | None = None,
    version: int = -1,
    repack: Callable[[], Decoder] | None = None,
) -> list[Completion]:
    """``n`` completions of one prompt, each with its behaviour logprobs and per-token
    versions (starting at `version`; `between_steps` may move it, see the module doc)."""
    if not prompt_ids:
        raise ValueError("generate: empty prompt")
    out = _Rows([[] for _ in range(n)], [[] for _ in range(n)], ["length"] * n,
                [[] for _ in range(n)])  # fmt: skip
    if max_new_tokens <= 0 or n <= 0:
        return _completions(out)
    cache = KVCache(dec, n, len(prompt_ids) + max_new_tokens)
    prompt = torch.tensor([list(prompt_ids)], dtype=torch.long, device=dec.device)
    logits = dec.forward(prompt, 0, cache).expand(n, -1)
    live = list(range(n))
    pos = len(prompt_ids)
    for step in range(max_new_tokens):
        nxt, lp = _draw(logits, temperature, top_p, generator)
        finished = _record(out, live, nxt.tolist(), lp.tolist(), eos_id, stops, version)
        if finished:
            keep = [j for j in range(len(live)) if live[j] not in finished]
            live = [live[j] for j in keep]
            if not live:
                break
            index = torch.tensor(keep, device=dec.device)
            cache.keep(index)
            nxt = nxt.index_select(0, index)
        if step + 1 < max_new_tokens:
            newer = between_steps() if between_steps is not None else None
            if newer is not None:
                version = newer
                dec = repack() if repack is not None else dec
            logits = dec.forward(nxt[:, None], pos, cache)
            pos += 1
    return _completions(out)


def _draw(
    logits: Tensor, temperature: float, top_p: float, generator: torch.Generator | None
) -> tuple[Tensor, Tensor]:
    if temperature <= 0:
        return logits.argmax(-1), torch.zeros(logits.shape[0], device=logits.device)
    dist = nucleus_logprobs(logits, temperature, top_p)
    nxt = draw(dist, generator)
    return nxt, dist.gather(-1, nxt[:, None]).squeeze(-1)


def _record(
    out: _Rows,
    live: list[int],
    tokens: list[int],
    logprobs: list[float],
    eos_id: int,
    stops: StopStrings | None,
    version: int,
) -> set[int]:
    """Append each live row's token; the rows that finished with it."""
    finished = set()
    for row, tok, lp in zip(live, tokens, logprobs, strict=True):
        out.tokens[row].append(tok)
        out.logprobs[row].append(lp)
        out.versions[row].append(version)
        if tok == eos_id or (stops is not None and stops.hit(out.tokens[row])):
            out.reasons[row] = "stop"
            finished.add(row)
    return finished


def _completions(out: _Rows) -> list[Completion]:
    rows = zip(out.tokens, out.logprobs, out.reasons, out.versions, strict=True)
    return [Completion(t, lp, r, v) for t, lp, r, v in rows]
