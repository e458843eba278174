"""Hugging Face causal language models as a `Policy`, loaded from a local directory.

`transformers` is imported lazily (only when this backend is used). Nothing is downloaded:
``from_path`` passes ``local_files_only=True``. The tokenizer is loaded when the directory
has one; the learner itself only needs token ids.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from learner.policy import export_state, logprobs_from_logits
from learner.sampling import BetweenSteps, Completion, sample

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class HFPolicy(nn.Module):
    """A `transformers` AutoModelForCausalLM implementing `learner.policy.Policy`."""

    def __init__(self, model: Any, path: str, tokenizer: Any = None, dtype: str | None = None):
        super().__init__()
        self.model = model
        self.path = path
        self.dtype_name = dtype
        self.tokenizer = tokenizer
        cfg = model.config
        self.vocab_size = int(cfg.vocab_size)
        self.max_seq_len = int(getattr(cfg, "max_position_embeddings", None) or 2048)
        eos = getattr(cfg, "eos_token_id", None)
        eos = eos[0] if isinstance(eos, list) else eos
        self.eos_id = int(eos) if eos is not None else self.vocab_size - 1
        pad = getattr(cfg, "pad_token_id", None)
        self.pad_id = int(pad) if pad is not None else self.eos_id

    @classmethod
    def from_path(cls, path: str | Path, dtype: str | None = None) -> HFPolicy:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        path = str(path)
        kwargs: dict[str, Any] = {"local_files_only": True}
        if dtype is not None:
            kwargs["dtype"] = _DTYPES[dtype]
        model = AutoModelForCausalLM.from_pretrained(path, **kwargs)
        tokenizer = None
        if any((Path(path) / f).exists() for f in ("tokenizer.json", "tokenizer_config.json")):
            tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)  # type: ignore[no-untyped-call]
        return cls(model, path, tokenizer, dtype)

    def token_logprobs(
        self,
        tokens: Tensor,
        attention_mask: Tensor | None = None,
        *,
        temperature: float = 1.0,
        with_entropy: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        out = self.model(input_ids=tokens, attention_mask=attention_mask, use_cache=False)
        return logprobs_from_logits(out.logits[:, :-1], tokens[:, 1:], temperature, with_entropy)

    def trainable_parameters(self) -> Iterator[nn.Parameter]:
        return (p for p in self.model.parameters() if p.requires_grad)

    def weights(self) -> dict[str, Tensor]:
        return export_state(self.model)

    def load_weights(self, state: Mapping[str, Tensor]) -> None:
        self.model.load_state_dict(dict(state), strict=True)

    def spec(self) -> dict[str, Any]:
        return {"kind": "hf", "path": self.path, "dtype": self.dtype_name}

    def _step(self, new_tokens: Tensor, cache: Any) -> tuple[Tensor, Any]:
        out = self.model(input_ids=new_tokens, past_key_values=cache, use_cache=True)
        return out.logits[:, -1], out.past_key_values

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
    ) -> list[Completion]:
        was_training = self.training
        self.eval()
        try:
            return sample(
                self._step,
                prompt_ids,
                n,
                max_new_tokens=max(0, min(max_new_tokens, self.max_seq_len - len(prompt_ids))),
                eos_id=self.eos_id,
                device=next(self.model.parameters()).device,
                temperature=temperature,
                top_p=top_p,
                generator=generator,
                between_steps=between_steps,
                version=version,
            )
        finally:
            self.train(was_training)
