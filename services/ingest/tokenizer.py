"""The policy's tokenizer, for traces that arrive without token ids.

`learner.model` names the policy: `tiny` is the built-in byte-level transformer (its
ByteTokenizer, learner/tiny.py), anything else a local Hugging Face model directory whose
tokenizer is loaded from disk (never downloaded). Both are imported only when the gateway
starts, so importing the gateway's modules stays cheap.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from services.ingest.convert import Tokenizer
    from services.settings import Settings


@dataclass
class ByteTokens:
    """The tiny policy's tokenizer behind the gateway's Tokenizer protocol."""

    inner: Any
    vocab_size: int
    bos_id: int | None
    eos_id: int | None

    def encode(self, text: str) -> list[int]:
        return list(self.inner.encode(text, bos=False, eos=False))


@dataclass
class HFTokens:
    """A Hugging Face tokenizer behind the gateway's Tokenizer protocol."""

    inner: Any
    vocab_size: int
    bos_id: int | None
    eos_id: int | None

    def encode(self, text: str) -> list[int]:
        return list(self.inner.encode(text, add_special_tokens=False))


def load(settings: Settings) -> Tokenizer:
    """The tokenizer of the configured policy."""
    from services.models import resolved

    model = resolved(settings).model
    if model == "tiny":
        from learner.tiny import ByteTokenizer

        tok = ByteTokenizer()
        return ByteTokens(tok, tok.vocab_size, tok.bos_id, tok.eos_id)
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(model, local_files_only=True)  # type: ignore[no-untyped-call]
    return HFTokens(hf, len(hf), hf.bos_token_id, hf.eos_token_id)
