"""The built-in policy: a small decoder-only transformer over bytes.

Pre-norm blocks (LayerNorm, causal multi-head attention through
`scaled_dot_product_attention`, GELU MLP), learned positions, untied output head, and a KV
cache for sampling. With the `[learner]` defaults (dim 128, 2 layers, ~0.5M parameters) it
learns small text tasks on two CPU cores in minutes; the same code runs on CUDA.

Tokenizer: one token per UTF-8 byte (ids 0-255) plus BOS, EOS and PAD.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from learner.policy import export_state, logprobs_from_logits
from learner.sampling import BetweenSteps, Completion, sample

KVCache = list[tuple[Tensor, Tensor]]


class ByteTokenizer:
    """UTF-8 bytes as tokens 0-255, then BOS, EOS and PAD."""

    bos_id = 256
    eos_id = 257
    pad_id = 258
    vocab_size = 259

    def encode(self, text: str, *, bos: bool = True, eos: bool = False) -> list[int]:
        ids = list(text.encode("utf-8"))
        return ([self.bos_id] if bos else []) + ids + ([self.eos_id] if eos else [])

    def decode(self, ids: Sequence[int]) -> str:
        """Bytes back to text; special tokens are skipped, invalid UTF-8 replaced."""
        return bytes(i for i in ids if 0 <= i < 256).decode("utf-8", errors="replace")


@dataclass(frozen=True, kw_only=True)
class TinyConfig:
    """The architecture. `dim`, `layers`, `heads` and `max_seq_len` are the section's
    `tiny_*` and `max_seq_len` keys (learner.spec.policy_spec); the rest are fixed by the
    byte tokenizer."""

    dim: int
    layers: int
    heads: int
    max_seq_len: int
    vocab_size: int = ByteTokenizer.vocab_size
    mlp_ratio: int = 4
    eos_id: int = ByteTokenizer.eos_id
    pad_id: int = ByteTokenizer.pad_id

    def __post_init__(self) -> None:
        if self.dim % self.heads:
            raise ValueError(f"dim {self.dim} is not a multiple of heads {self.heads}")
        if not (0 <= self.eos_id < self.vocab_size and 0 <= self.pad_id < self.vocab_size):
            raise ValueError(f"eos_id and pad_id must lie in the vocabulary [0, {self.vocab_size})")

    def to_dict(self) -> dict[str, Any]:
        return {"kind": "tiny", **asdict(self)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TinyConfig:
        names = {f.name for f in fields(cls)}
        return cls(**{k: int(v) for k, v in data.items() if k in names})


class _Block(nn.Module):
    def __init__(self, cfg: TinyConfig) -> None:
        super().__init__()
        self.heads = cfg.heads
        self.ln1 = nn.LayerNorm(cfg.dim)
        self.qkv = nn.Linear(cfg.dim, 3 * cfg.dim)
        self.proj = nn.Linear(cfg.dim, cfg.dim)
        self.ln2 = nn.LayerNorm(cfg.dim)
        self.mlp = nn.Sequential(
            nn.Linear(cfg.dim, cfg.mlp_ratio * cfg.dim),
            nn.GELU(),
            nn.Linear(cfg.mlp_ratio * cfg.dim, cfg.dim),
        )

    def forward(
        self, x: Tensor, past: tuple[Tensor, Tensor] | None
    ) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        if past is not None:
            k, v = torch.cat([past[0], k], dim=2), torch.cat([past[1], v], dim=2)
        if past is None:
            att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        elif t == 1:
            att = F.scaled_dot_product_attention(q, k, v)
        else:  # several new tokens after a cache: each sees the past and its own prefix
            offset = k.shape[2] - t
            allowed = torch.ones(t, k.shape[2], dtype=torch.bool, device=x.device).tril(offset)
            att = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed)
        x = x + self.proj(att.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.ln2(x)), (k, v)


class TinyPolicy(nn.Module):
    """A small GPT-style policy implementing `learner.policy.Policy`."""

    def __init__(self, cfg: TinyConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.tokenizer = ByteTokenizer()
        self.vocab_size = self.cfg.vocab_size
        self.max_seq_len = self.cfg.max_seq_len
        self.pad_id, self.eos_id = self.cfg.pad_id, self.cfg.eos_id
        self.tok_emb = nn.Embedding(self.cfg.vocab_size, self.cfg.dim)
        self.pos_emb = nn.Embedding(self.cfg.max_seq_len, self.cfg.dim)
        self.blocks = nn.ModuleList(_Block(self.cfg) for _ in range(self.cfg.layers))
        self.ln_f = nn.LayerNorm(self.cfg.dim)
        self.head = nn.Linear(self.cfg.dim, self.cfg.vocab_size, bias=False)
        self.apply(self._init)
        for name, p in self.named_parameters():  # GPT-2 style scaled init of residual outputs
            if name.endswith(("proj.weight", "mlp.2.weight")):
                nn.init.normal_(p, std=0.02 / math.sqrt(2 * self.cfg.layers))

    @staticmethod
    def _init(m: nn.Module) -> None:
        if isinstance(m, nn.Linear | nn.Embedding):
            nn.init.normal_(m.weight, std=0.02)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)

    def forward(self, tokens: Tensor, cache: KVCache | None = None) -> tuple[Tensor, KVCache]:
        start = cache[0][0].shape[2] if cache else 0
        if start + tokens.shape[1] > self.cfg.max_seq_len:
            raise ValueError(
                f"sequence of {start + tokens.shape[1]} tokens exceeds max_seq_len "
                f"{self.cfg.max_seq_len}"
            )
        pos = torch.arange(start, start + tokens.shape[1], device=tokens.device)
        x = self.tok_emb(tokens) + self.pos_emb(pos)
        new_cache: KVCache = []
        for i, block in enumerate(self.blocks):
            x, kv = block(x, cache[i] if cache else None)
            new_cache.append(kv)
        return self.head(self.ln_f(x)), new_cache

    def token_logprobs(
        self,
        tokens: Tensor,
        attention_mask: Tensor | None = None,
        *,
        temperature: float = 1.0,
        with_entropy: bool = False,
        shared_prefix: int = 0,  # a few small matmuls: running the prefix once gains nothing
    ) -> tuple[Tensor, Tensor | None]:
        # right padding + causal attention: real tokens never see the padding after them
        logits, _ = self(tokens)
        return logprobs_from_logits(logits[:, :-1], tokens[:, 1:], temperature, with_entropy)

    def trainable_parameters(self) -> Iterator[nn.Parameter]:
        return (p for p in self.parameters() if p.requires_grad)

    def weights(self) -> dict[str, Tensor]:
        return export_state(self)

    def load_weights(self, state: Mapping[str, Tensor]) -> None:
        self.load_state_dict(dict(state), strict=True)

    def spec(self) -> dict[str, Any]:
        return self.cfg.to_dict()

    def _step(self, new_tokens: Tensor, cache: KVCache | None) -> tuple[Tensor, KVCache]:
        logits, cache = self(new_tokens, cache)
        return logits[:, -1], cache

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
        room = self.cfg.max_seq_len - len(prompt_ids)
        was_training = self.training
        self.eval()
        try:
            return sample(
                self._step,
                prompt_ids,
                n,
                max_new_tokens=max(0, min(max_new_tokens, room)),
                eos_id=self.eos_id,
                device=self.tok_emb.weight.device,
                temperature=temperature,
                top_p=top_p,
                generator=generator,
                between_steps=between_steps,
                version=version,
            )
        finally:
            self.train(was_training)
