"""Fast batched decoding for Llama-family Hugging Face models (SmolLM2, Llama ...), on CPU
or GPU.

`transformers`' own forward spends most of a decoding step in Python (module calls, cache
objects, masks) and computes logits for every prompt position. `Decoder` runs the same
arithmetic as `LlamaForCausalLM` with less around it:

- the weights are packed once per weight version (q/k/v and gate/up fused into one matrix
  each, LoRA deltas merged) in the sampling dtype (bf16 halves the bytes a memory-bound
  decoding step reads where the CPU multiplies bf16 natively), or with ``int4`` the
  layers' matrices in 4 bits and the head in 8 (learner/quant.py; LoRA adapters then
  stay a low-rank term beside the frozen base, which is packed once);
- a static KV cache, allocated for prompt + max_new_tokens;
- a group shares its prompt: the prompt is run once (batch 1) and its cache copied to the
  ``n`` rows; logits only for the last position;
- finished rows (end-of-sequence, a stop string, see learner/stops.py) are dropped from the
  batch, so the tail of a group costs what its live rows cost;
- few ops per layer: q and k rotated together, a decoding step's attention as two matmuls
  over the cache's written positions (views of the static cache), tokens drawn by inverse
  transform sampling (`learner.sampling.draw`; torch.multinomial spent 8 ms a step on the
  49k vocabulary). At batch 8 on 2 CPU cores a step is then mostly the weight matmuls:
  bf16 on an AMD EPYC with avx512_bf16, ~29 ms of a ~37 ms step; on an Intel Xeon without
  it float32 is faster than bf16, and int4 takes a step from ~85 to ~39 ms (its kernels
  about 15 ms, the head's 5, attention, norms, rotary and the draw most of the rest).

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

from learner import quant
from learner.quant import Dense, Int4, Int8Rows, Linear, LowRank
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


@dataclass
class _Layer:
    ln1: Tensor
    qkv: Linear
    o: Linear
    ln2: Tensor
    gate_up: Linear
    down: Linear


def weights_version(model: nn.Module) -> int:
    """Changes whenever a parameter is modified in place (optimizer step, load_state_dict)."""
    return sum(int(getattr(p, "_version", 0)) for p in model.parameters())


class Decoder:
    """Packed weights of one `LlamaForCausalLM` (or peft wrapping one) in ``dtype``; with
    ``int4`` (CPU) the layers' matrices in 4 bits and the LM head in 8 (learner/quant.py),
    ``dtype`` then being that of the activations. ``packs`` keeps int4 matrices across
    decoders, keyed by their source weights and versions (frozen LoRA base weights are
    packed once)."""

    def __init__(
        self,
        model: Any,
        dtype: torch.dtype,
        *,
        int4: bool = False,
        packs: dict[Any, Linear] | None = None,
    ) -> None:
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        cfg = base.config
        self.dtype = dtype
        self.heads = int(cfg.num_attention_heads)
        self.kv_heads = int(getattr(cfg, "num_key_value_heads", None) or self.heads)
        self.head_dim = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // self.heads)
        self.eps = float(cfg.rms_norm_eps)
        self.version = weights_version(model)
        self.int4 = int4
        self.packs: dict[Any, Linear] = {}
        self._old = packs if packs is not None else {}
        with torch.no_grad():
            self._pack(base, dtype)
        self._old = {}  # what the previous decoder packed and this one did not reuse: freed
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
        tied = head.data_ptr() == inner.embed_tokens.weight.data_ptr()
        if self.int4 and lora_factors((base.lm_head,)) is None:
            self.head: Linear = self._packed((base.lm_head,), lambda: Int8Rows.of(head))
        else:
            self.head = Dense(self.embed if tied else cast(head))
        self.norm = cast(inner.norm.weight)
        self.layers = []
        for layer in inner.layers:
            att, mlp = layer.self_attn, layer.mlp
            self.layers.append(_Layer(
                ln1=cast(layer.input_layernorm.weight),
                qkv=self._linear((att.q_proj, att.k_proj, att.v_proj), cast),
                o=self._linear((att.o_proj,), cast),
                ln2=cast(layer.post_attention_layernorm.weight),
                gate_up=self._linear((mlp.gate_proj, mlp.up_proj), cast),
                down=self._linear((mlp.down_proj,), cast),
            ))  # fmt: skip

    def _linear(self, linears: Sequence[nn.Module], cast: Callable[[Tensor], Tensor]) -> Linear:
        """The fused matrix of ``linears``: dense with their adapters merged; int4 as
        base plus adapters (`quant.LowRank`) where the kernel takes its shape."""
        ws = [base_weight(m) for m in linears]
        rows, cols = sum(w.shape[0] for w in ws), ws[0].shape[1]
        if not self.int4 or not quant.int4_fits(rows, cols):
            return Dense(cast(torch.cat([effective_weight(m) for m in linears])))
        packed = self._packed(linears, lambda: Int4.of(torch.cat(ws)))
        factors = lora_factors(linears)
        if factors is None:
            return packed
        assert isinstance(packed, Int4)
        return LowRank(packed, *(t.to(self.dtype) for t in factors))

    def _packed(self, linears: Sequence[nn.Module], make: Callable[[], Linear]) -> Linear:
        ws = [base_weight(m) for m in linears]
        key = tuple((w.data_ptr(), int(getattr(w, "_version", 0)), tuple(w.shape)) for w in ws)
        found = self._old.get(key)
        self.packs[key] = found if found is not None else make()
        return self.packs[key]

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
        h = F.embedding(tokens, self.embed)
        for i, layer in enumerate(self.layers):
            qkv = layer.qkv(self._rms(h, layer.ln1)).view(b, t, nq + 2 * nk, hd)
            qk = _rotate(qkv[:, :, : nq + nk].transpose(1, 2), cos, sin)  # q and k at once
            q, k = qk[:, :nq], qk[:, nq:]
            keys, values = cache.write(i, pos, k, qkv[:, :, nq + nk :].transpose(1, 2))
            att = _attend(q, keys, values)
            h = h + layer.o(att.transpose(1, 2).reshape(b, t, nq * hd))
            gate, up = layer.gate_up(self._rms(h, layer.ln2)).chunk(2, dim=-1)
            h = h + layer.down(F.silu(gate) * up)
        return self.head(self._rms(h[:, -1], self.norm)).float()


def _attend(q: Tensor, keys: Tensor, values: Tensor) -> Tensor:
    """Causal attention of ``q`` ``[B, Hq, T, D]`` (grouped-query: Hq a multiple of the kv
    heads Hk). A prompt (T > 1, ``keys``/``values`` ``[B, Hk, T, D]``): the fused kernel.
    One new token per row: over every written position (KVCache's layout: ``keys``
    ``[B, Hk, D, P]``, ``values`` ``[B, Hk, P, D]``, views of the static cache, so no
    mask): two batched matmuls and a softmax, each kv head's query heads side by side.
    CPU's fused kernel costs about 0.35 ms per layer at this size; attending over the whole
    static cache with a mask made a step about 2.5% slower at 128 new tokens."""
    b, hq, t, d = q.shape
    if t > 1:
        return F.scaled_dot_product_attention(q, keys, values, is_causal=True, enable_gqa=True)
    hk = keys.shape[1]
    grouped = q.reshape(b, hk, hq // hk, d)  # the query heads that share a kv head
    scores = torch.matmul(grouped, keys).float() * (d**-0.5)
    weights = torch.softmax(scores, dim=-1).to(values.dtype)
    return torch.matmul(weights, values).reshape(b, hq, 1, d)


def _rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotary embedding, as transformers' `x * cos + rotate_half(x) * sin`, with the sign of
    rotate_half's negated half folded into ``sin`` (Decoder.rope): one roll, no cat."""
    return x * cos + x.roll(x.shape[-1] // 2, dims=-1) * sin


class KVCache:
    """Static keys ``[rows, kv_heads, head_dim, length]`` (transposed: what the scores'
    matmul takes as is) and values ``[rows, kv_heads, length, head_dim]`` per layer;
    attention reads the written positions only (views, no copy)."""

    def __init__(self, dec: Decoder, rows: int, length: int) -> None:
        kt = (rows, dec.kv_heads, dec.head_dim, length)
        vs = (rows, dec.kv_heads, length, dec.head_dim)
        self.k = [torch.zeros(kt, dtype=dec.dtype, device=dec.device) for _ in dec.layers]
        self.v = [torch.zeros(vs, dtype=dec.dtype, device=dec.device) for _ in dec.layers]
        self.cos, self.sin = dec.rope(length)

    def write(self, layer: int, pos: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Store ``k``, ``v`` ``[B, kv_heads, T, head_dim]`` at ``pos``; what `_attend`
        attends over: the prompt itself (pos 0), else the layer's positions up to ``pos``."""
        end = pos + k.shape[2]
        self.k[layer][:, :, :, pos:end] = k.transpose(-1, -2)  # a batch-1 prompt broadcasts
        self.v[layer][:, :, pos:end] = v
        if pos == 0:  # the prompt attends to itself (one row for the whole group)
            return k, v.to(self.v[layer].dtype)  # an int4 matmul's output is bf16
        return self.k[layer][..., :end], self.v[layer][:, :, :end]

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
