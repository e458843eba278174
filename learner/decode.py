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
- `generate_many` decodes different prompts together (evaluation), left-padded, each row
  with its own rotary positions and its pad columns hidden (learner/attention.py);
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
from learner.attention import KVCache, rotate
from learner.packing import base_weight, effective_weight, lora_factors, weights_version
from learner.quant import Dense, Int4, Int8Rows, Linear, LowRank
from learner.sampling import BetweenSteps, Completion, draw, nucleus_logprobs
from learner.stops import StopStrings

SUPPORTED = frozenset({"llama"})
"""`config.model_type`s whose forward `Decoder` reproduces."""


def supports(model: Any) -> bool:
    cfg = getattr(model, "config", None)
    return getattr(cfg, "model_type", None) in SUPPORTED and not getattr(cfg, "rope_scaling", None)


@dataclass
class _Layer:
    ln1: Tensor
    qkv: Linear
    o: Linear
    ln2: Tensor
    gate_up: Linear
    down: Linear


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
        compiled: bool = False,
    ) -> None:
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        cfg = base.config
        self.dtype = dtype
        self.heads = int(cfg.num_attention_heads)
        self.kv_heads = int(getattr(cfg, "num_key_value_heads", None) or self.heads)
        self.head_dim = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // self.heads)
        self.eps = float(cfg.rms_norm_eps)
        self.version = weights_version(model)
        self.int4, self.compiled = int4, compiled
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

    @property
    def depth(self) -> int:
        return len(self.layers)

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
        cos, sin = cache.rotary(pos, t)
        h = F.embedding(tokens, self.embed)
        for i, layer in enumerate(self.layers):
            qkv = layer.qkv(self._rms(h, layer.ln1)).view(b, t, nq + 2 * nk, hd)
            qk = rotate(qkv[:, :, : nq + nk].transpose(1, 2), cos, sin)  # q and k at once
            q, k = qk[:, :nq], qk[:, nq:]
            keys, values = cache.write(i, pos, k, qkv[:, :, nq + nk :].transpose(1, 2))
            att = cache.attend(q, keys, values)
            h = h + layer.o(att.transpose(1, 2).reshape(b, t, nq * hd))
            gate, up = layer.gate_up(self._rms(h, layer.ln2)).chunk(2, dim=-1)
            h = h + layer.down(F.silu(gate) * up)
        return self.head(self._rms(h[:, -1], self.norm)).float()

    def step(self, tokens: Tensor, pos: int, cache: KVCache) -> Tensor:
        """`forward` of one new token per row; through `torch.compile` if ``compiled``."""
        if not self.compiled:
            return self.forward(tokens, pos, cache)
        with _no_duck_shapes():
            return _compiled_forward()(self, tokens.contiguous(), pos, cache)  # type: ignore[no-any-return]


_COMPILED: Any = None


def _compiled_forward() -> Any:
    """`Decoder.forward` compiled once per process (inductor, shapes dynamic): its guards
    are on shapes and types, so decoders of later weight versions reuse the compiled code."""
    global _COMPILED
    if _COMPILED is None:
        _COMPILED = torch.compile(Decoder.forward, dynamic=True)
    return _COMPILED


def _no_duck_shapes() -> Any:
    """Sizes that happen to be equal (a batch of 16 rows, a LoRA rank of 16) stay distinct
    symbols, so the batch shrinking does not recompile."""
    from torch.fx.experimental import _config

    return _config.patch(use_duck_shape=False)  # type: ignore[attr-defined]


@dataclass
class _Rows:
    tokens: list[list[int]]
    logprobs: list[list[float]]
    reasons: list[str]
    versions: list[list[int]]


@dataclass(frozen=True)
class Draw:
    """How tokens are drawn: until end-of-sequence or ``max_new_tokens``; temperature 0 is
    greedy (behaviour logprobs then 0)."""

    max_new_tokens: int
    eos_id: int
    temperature: float = 1.0
    top_p: float = 1.0
    generator: torch.Generator | None = None


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
    how = Draw(max_new_tokens, eos_id, temperature, top_p, generator)
    if max_new_tokens <= 0 or n <= 0:
        return [Completion([], [], "length", []) for _ in range(n)]
    cache = KVCache(dec, n, len(prompt_ids) + max_new_tokens)
    prompt = torch.tensor([list(prompt_ids)], dtype=torch.long, device=dec.device)
    logits = dec.forward(prompt, 0, cache).expand(n, -1)
    live = _Live(dec, cache, [stops] * n, version, between_steps, repack)
    return live.run(logits, len(prompt_ids), how)


@torch.no_grad()
def generate_many(
    dec: Decoder,
    prompts: Sequence[Sequence[int]],
    how: Draw,
    stops: Sequence[StopStrings | None] | None = None,
) -> list[Completion]:
    """One completion of each prompt (a prompt given twice is sampled twice), the prompts
    left-padded into one batch (`learner.attention.Padding`: each row decodes as it would
    alone), each row ending at end-of-sequence or at its own ``stops``."""
    if any(not p for p in prompts):
        raise ValueError("generate_many: empty prompt")
    if how.max_new_tokens <= 0 or not prompts:
        return [Completion([], [], "length", []) for _ in prompts]
    width = max(len(p) for p in prompts)
    pads = [width - len(p) for p in prompts]
    ids = [[0] * pad + list(p) for pad, p in zip(pads, prompts, strict=True)]
    cache = KVCache(dec, len(prompts), width + how.max_new_tokens, pads=pads)
    logits = dec.forward(torch.tensor(ids, dtype=torch.long, device=dec.device), 0, cache)
    live = _Live(dec, cache, list(stops) if stops is not None else [None] * len(prompts))
    return live.run(logits, width, how)


class _Live:
    """The decoding loop over a batch's live rows: draw, record, drop finished rows, step."""

    def __init__(
        self,
        dec: Decoder,
        cache: KVCache,
        stops: list[StopStrings | None],
        version: int = -1,
        between_steps: BetweenSteps | None = None,
        repack: Callable[[], Decoder] | None = None,
    ) -> None:
        n = len(stops)
        self.dec, self.cache, self.stops, self.version = dec, cache, stops, version
        self.between_steps, self.repack = between_steps, repack
        self.out = _Rows([[] for _ in range(n)], [[] for _ in range(n)], ["length"] * n,
                         [[] for _ in range(n)])  # fmt: skip
        self.rows = list(range(n))

    def run(self, logits: Tensor, pos: int, how: Draw) -> list[Completion]:
        for step in range(how.max_new_tokens):
            nxt, lp = _draw(logits, how.temperature, how.top_p, how.generator)
            nxt = self._record(nxt, lp, how.eos_id)
            if not self.rows or step + 1 >= how.max_new_tokens:
                break
            newer = self.between_steps() if self.between_steps is not None else None
            if newer is not None:
                self.version = newer
                self.dec = self.repack() if self.repack is not None else self.dec
            logits = self.dec.step(nxt[:, None], pos, self.cache)
            pos += 1
        return _completions(self.out)

    def _record(self, nxt: Tensor, lp: Tensor, eos_id: int) -> Tensor:
        """Append each live row's token; drop the rows that finished with it (from the
        cache too); the tokens of the rows left."""
        out, finished = self.out, set()
        for row, tok, p in zip(self.rows, nxt.tolist(), lp.tolist(), strict=True):
            out.tokens[row].append(tok)
            out.logprobs[row].append(p)
            out.versions[row].append(self.version)
            stops = self.stops[row]
            if tok == eos_id or (stops is not None and stops.hit(out.tokens[row])):
                out.reasons[row] = "stop"
                finished.add(row)
        if not finished:
            return nxt
        keep = [j for j, row in enumerate(self.rows) if row not in finished]
        self.rows = [self.rows[j] for j in keep]
        if not self.rows:
            return nxt[:0]
        index = torch.tensor(keep, device=nxt.device)
        self.cache.keep(index)
        return nxt.index_select(0, index)


def _draw(
    logits: Tensor, temperature: float, top_p: float, generator: torch.Generator | None
) -> tuple[Tensor, Tensor]:
    if temperature <= 0:
        return logits.argmax(-1), torch.zeros(logits.shape[0], device=logits.device)
    dist = nucleus_logprobs(logits, temperature, top_p)
    nxt = draw(dist, generator)
    return nxt, dist.gather(-1, nxt[:, None]).squeeze(-1)


def _completions(out: _Rows) -> list[Completion]:
    rows = zip(out.tokens, out.logprobs, out.reasons, out.versions, strict=True)
    return [Completion(t, lp, r, v) for t, lp, r, v in rows]
