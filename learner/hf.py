"""Hugging Face causal language models as a `Policy`, loaded from a local directory.

`transformers` is imported lazily (only when this backend is used). Nothing is downloaded:
``from_path`` passes ``local_files_only=True``. The tokenizer is loaded when the directory
has one; the learner itself only needs token ids.

Sampling: Llama-family models decode with `learner.decode.Decoder` (packed weights in the
sampling dtype, static KV cache, the group's prompt run once); other architectures go
through `learner.sampling.sample` with the model's own forward. LoRA (peft) wraps the model
when ``lora_rank > 0``: only the adapters train, and `weights()` / `load_weights` carry only
them (the base weights are the pretrained ones on every side), so a published version is a
few MB.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from learner.cpu import fast_bf16_cpu
from learner.policy import export_state, logprobs_from_logits
from learner.sampling import BetweenSteps, Completion, sample
from learner.stops import StopStrings

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
LORA_MARK = "lora_"
"""State-dict keys of LoRA adapters contain this."""


@dataclass(frozen=True)
class LoraSpec:
    rank: int
    alpha: float
    targets: tuple[str, ...]


def sampling_dtype(name: str | None, device: torch.device, model_dtype: torch.dtype) -> torch.dtype:
    """Dense sampling weights' dtype. None: the model's dtype. `auto`: bfloat16 where its
    matmuls are native (CUDA with bf16, a CPU with avx512_bf16/AMX where they measure
    faster than float32: `fast_bf16_cpu`), else the model's dtype. `int4`: the
    activations' dtype, the model's."""
    if name is None or name == "int4":
        return model_dtype
    if name != "auto":
        return _DTYPES[name]
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else model_dtype
    return torch.bfloat16 if device.type == "cpu" and fast_bf16_cpu() else model_dtype


def int4_sampling(name: str | None, device: torch.device, lora: bool) -> str:
    """Whether the decoder packs weights in int4 (learner/quant.py): `yes` for
    `sample_dtype = "int4"` (CPU only), `if exact` for `auto` on a CPU with LoRA on (the
    base weights are frozen, so an exact grid stays exact; each LoRA update still reaches
    the sampler in full), else `no`. Full fine-tuning never gets it from `auto`: a step's
    change is far below a 4-bit grid's spacing and would be rounded away."""
    from learner import quant

    if name == "int4":
        if device.type != "cpu":
            raise ValueError("learner.sample_dtype = int4 is for CPU sampling; use bfloat16")
        if not quant.available():
            raise ValueError(f"learner.sample_dtype = int4 needs torch's int4 CPU kernels "
                             f"(torch {torch.__version__} lacks them)")  # fmt: skip
        return "yes"
    if name == "auto" and device.type == "cpu" and lora and quant.available():
        return "if exact"
    return "no"


def _attention(layer: Any) -> tuple[Any, ...]:
    att = layer.self_attn
    return att.q_proj, att.k_proj, att.v_proj, att.o_proj


def _mlp(layer: Any) -> tuple[Any, ...]:
    return layer.mlp.gate_proj, layer.mlp.up_proj, layer.mlp.down_proj


def with_lora(model: Any, lora: LoraSpec) -> Any:
    from peft import LoraConfig, get_peft_model

    kwargs: dict[str, Any] = {"r": lora.rank, "lora_alpha": lora.alpha, "bias": "none",
                              "target_modules": list(lora.targets), "lora_dropout": 0}  # fmt: skip
    return get_peft_model(model, LoraConfig(**kwargs))


class HFPolicy(nn.Module):
    """A `transformers` AutoModelForCausalLM implementing `learner.policy.Policy`."""

    def __init__(
        self,
        model: Any,
        path: str,
        tokenizer: Any = None,
        dtype: str | None = None,
        *,
        sample_dtype: str | None = None,
        lora: LoraSpec | None = None,
        sample_compile: bool = False,
    ):
        super().__init__()
        self.sample_compile = sample_compile
        self.model = with_lora(model, lora) if lora is not None else model
        self.path = path
        self.dtype_name = dtype
        self.sample_dtype = sample_dtype
        self.lora = lora
        self.tokenizer = tokenizer
        cfg = model.config
        self.vocab_size = int(cfg.vocab_size)
        self.max_seq_len = int(getattr(cfg, "max_position_embeddings", None) or 2048)
        eos = getattr(cfg, "eos_token_id", None)
        eos = eos[0] if isinstance(eos, list) else eos
        self.eos_id = int(eos) if eos is not None else self.vocab_size - 1
        pad = getattr(cfg, "pad_token_id", None)
        self.pad_id = int(pad) if pad is not None else self.eos_id
        self._decoder: Any = None
        self._int4_exact: bool | None = None

    @classmethod
    def from_path(
        cls,
        path: str | Path,
        dtype: str | None = None,
        *,
        sample_dtype: str | None = None,
        lora: LoraSpec | None = None,
        sample_compile: bool = False,
    ) -> HFPolicy:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        path = str(path)
        kwargs: dict[str, Any] = {"local_files_only": True}
        if dtype is not None:
            kwargs["dtype"] = _DTYPES[dtype]
        model = AutoModelForCausalLM.from_pretrained(path, **kwargs)
        tokenizer = None
        if any((Path(path) / f).exists() for f in ("tokenizer.json", "tokenizer_config.json")):
            tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)  # type: ignore[no-untyped-call]
        return cls(model, path, tokenizer, dtype, sample_dtype=sample_dtype, lora=lora,
                   sample_compile=sample_compile)  # fmt: skip

    def token_logprobs(
        self,
        tokens: Tensor,
        attention_mask: Tensor | None = None,
        *,
        temperature: float = 1.0,
        with_entropy: bool = False,
        shared_prefix: int = 0,
    ) -> tuple[Tensor, Tensor | None]:
        if shared_prefix >= 2 and tokens.shape[0] > 1 and shared_prefix < tokens.shape[1]:
            return self._shared_prefix_logprobs(
                tokens, attention_mask, shared_prefix, temperature, with_entropy
            )
        out = self.model(input_ids=tokens, attention_mask=attention_mask, use_cache=False)
        return logprobs_from_logits(out.logits[:, :-1], tokens[:, 1:], temperature, with_entropy)

    def _shared_prefix_logprobs(
        self, tokens: Tensor, attention_mask: Tensor | None, p: int, temp: float, entropy: bool
    ) -> tuple[Tensor, Tensor | None]:
        """`token_logprobs` of rows whose first `p` tokens are equal: the prefix runs once
        and its KV cache is repeated for the rows' tails. The same numbers and gradients as
        the plain forward (backward sums the rows' gradients into the one prefix pass)."""
        rows, width = tokens.shape
        head = self.model(input_ids=tokens[:1, :p], use_cache=True)
        cache = head.past_key_values
        cache.batch_repeat_interleave(rows)
        mask = attention_mask if attention_mask is not None else torch.ones_like(tokens)
        pos = torch.arange(p, width, device=tokens.device)
        tail = self.model(
            input_ids=tokens[:, p:], attention_mask=mask, past_key_values=cache,
            position_ids=pos.expand(rows, -1), cache_position=pos, use_cache=True,
        )  # fmt: skip
        # logit positions 0..p-2 predict the prefix itself: one row, the same for all
        lp_head, ent_head = logprobs_from_logits(
            head.logits[:, :-1], tokens[:1, 1:p], temp, entropy
        )
        tail_logits = torch.cat([head.logits[:, -1:].expand(rows, -1, -1), tail.logits[:, :-1]], 1)
        lp_tail, ent_tail = logprobs_from_logits(tail_logits, tokens[:, p:], temp, entropy)
        logp = torch.cat([lp_head.expand(rows, -1), lp_tail], 1)
        if ent_head is None or ent_tail is None:
            return logp, None
        return logp, torch.cat([ent_head.expand(rows, -1), ent_tail], 1)

    def trainable_parameters(self) -> Iterator[nn.Parameter]:
        return (p for p in self.model.parameters() if p.requires_grad)

    def weights(self) -> dict[str, Tensor]:
        state = export_state(self.model)
        if self.lora is None:
            return state
        return {k: v for k, v in state.items() if LORA_MARK in k}

    def load_weights(self, state: Mapping[str, Tensor]) -> None:
        if self.lora is None:
            self.model.load_state_dict(dict(state), strict=True)
            return
        wanted = {k for k in self.model.state_dict() if LORA_MARK in k}
        if set(state) != wanted:
            missing, extra = sorted(wanted - set(state)), sorted(set(state) - wanted)
            raise KeyError(f"LoRA weights: missing {missing[:3]}, unexpected {extra[:3]}")
        self.model.load_state_dict(dict(state), strict=False)

    def spec(self) -> dict[str, Any]:
        spec: dict[str, Any] = {"kind": "hf", "path": self.path, "dtype": self.dtype_name}
        spec["sample_dtype"] = self.sample_dtype
        spec["lora"] = asdict(self.lora) if self.lora is not None else None
        spec["sample_compile"] = self.sample_compile
        return spec

    def _step(self, new_tokens: Tensor, cache: Any) -> tuple[Tensor, Any]:
        out = self.model(
            input_ids=new_tokens, past_key_values=cache, use_cache=True, logits_to_keep=1
        )
        return out.logits[:, -1], out.past_key_values

    def decoder(self, exact: bool = False) -> Any:
        """The fast decoder over the current weights (repacked after any weight change), or
        None for architectures it does not cover. In the sampling dtype, or with ``exact``
        in the model's own (evaluation: int4 or bf16 flip greedy choices where two tokens
        nearly tie; benchmarks/evaluation.py counts them)."""
        from learner import decode
        from learner.packing import weights_version

        base = self.model.get_base_model() if self.lora else self.model
        if not decode.supports(base):
            return None
        param = next(self.model.parameters())
        dtype, int4 = (
            (param.dtype, False)
            if exact
            else self.sampling_mode(self.sample_dtype, self.lora is not None)
        )
        compiled = self.sample_compile and not exact
        dec = self._decoder
        stale = dec is None or (dec.dtype, dec.int4, dec.compiled) != (dtype, int4, compiled)
        if stale or dec.device != param.device or dec.version != weights_version(self.model):
            packs = dec.packs if dec is not None else None
            self._decoder = dec = decode.Decoder(
                self.model, dtype, int4=int4, packs=packs, compiled=compiled
            )
        return dec

    def sampling_mode(self, name: str | None, lora: bool) -> tuple[torch.dtype, bool]:
        """What the decoder packs with for `sample_dtype` ``name``, with or without LoRA:
        the dtype (of the weights, or with int4 of the activations) and whether int4."""
        param = next(self.model.parameters())
        dtype = sampling_dtype(name, param.device, param.dtype)
        int4 = int4_sampling(name, param.device, lora)
        if int4 != "if exact":
            return dtype, int4 == "yes"
        if self._on_int4_grid(self.model.get_base_model() if self.lora else self.model):
            return dtype, True
        return sampling_dtype("auto", param.device, param.dtype), False

    def _on_int4_grid(self, base: Any) -> bool:
        """Whether every layer matrix of the (frozen) base model that the int4 kernel
        takes is on an int4 grid (`quant.off_grid`) and there is one, checked once."""
        if self._int4_exact is None:
            from learner import quant
            from learner.packing import base_weight

            with torch.no_grad():
                fits = [
                    base_weight(m)
                    for layer in base.model.layers
                    for m in (*_attention(layer), *_mlp(layer))
                    if quant.int4_fits(*base_weight(m).shape)
                ]  # none: int4 would only round the head
                self._int4_exact = bool(fits) and all(
                    quant.off_grid(w) < quant.ON_GRID for w in fits
                )
        return self._int4_exact

    def stop_strings(self, stop: Sequence[str]) -> StopStrings | None:
        if not stop:
            return None
        if self.tokenizer is None:
            raise ValueError("stop strings need the model's tokenizer")
        tok = self.tokenizer
        return StopStrings(
            stop, lambda ids: str(tok.decode(ids, clean_up_tokenization_spaces=False))
        )

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
        stop: Sequence[str] = (),
    ) -> list[Completion]:
        """`Policy.sample`; ``stop``: strings that end a completion at the token completing
        one of them (finish reason ``stop``, as for end-of-sequence)."""
        budget = max(0, min(max_new_tokens, self.max_seq_len - len(prompt_ids)))
        stops = self.stop_strings(stop)
        kw: dict[str, Any] = {"max_new_tokens": budget, "eos_id": self.eos_id, "top_p": top_p,
                              "temperature": temperature, "generator": generator,
                              "between_steps": between_steps, "version": version}  # fmt: skip
        was_training = self.training
        self.eval()
        try:
            dec = self.decoder()
            if dec is not None:
                from learner.decode import generate

                return generate(dec, prompt_ids, n, stops=stops, repack=self.decoder, **kw)
            device = next(self.model.parameters()).device
            out = sample(self._step, prompt_ids, n, device=device, **kw)
            return [stops.truncate(c) for c in out] if stops else out
        finally:
            self.train(was_training)
