"""Text <-> token ids for the policy a generator samples from.

The built-in tiny policy uses its byte tokenizer (BOS before the prompt, EOS ends a
turn). A Hugging Face policy uses the tokenizer saved next to the model; with a chat model
(its tokenizer has a chat template) every prompt goes through the template: chat-message
prompts as they are, a text prompt as one user message, then the assistant's turn opens.
Its end-of-sequence token is the tokenizer's (the end of a chat turn, learner/pretrained.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from schemas.rollout import Task
from services.rollout.admission import prompt_text


class TextCodec(Protocol):
    def prompt_ids(self, task: Task) -> list[int]:
        """Token ids of the task's prompt, ready for sampling."""
        ...

    def ids(self, text: str) -> list[int]:
        """Token ids of text inserted mid-episode (an observation)."""
        ...

    def text(self, ids: Sequence[int]) -> str:
        """Text of sampled ids, special tokens dropped."""
        ...


class ByteCodec:
    def __init__(self, tokenizer: Any) -> None:
        self.tok = tokenizer

    def prompt_ids(self, task: Task) -> list[int]:
        return list(self.tok.encode(prompt_text(task), bos=True))

    def ids(self, text: str) -> list[int]:
        return list(self.tok.encode(text, bos=False))

    def text(self, ids: Sequence[int]) -> str:
        return str(self.tok.decode(ids))


class HFCodec:
    def __init__(self, tokenizer: Any) -> None:
        self.tok = tokenizer

    def prompt_ids(self, task: Task) -> list[int]:
        if not getattr(self.tok, "chat_template", None):
            return list(self.tok(prompt_text(task))["input_ids"])
        if task.messages:
            chat = [{"role": m.role, "content": m.content or ""} for m in task.messages]
        else:
            chat = [{"role": "user", "content": prompt_text(task)}]
        return [int(i) for i in self.tok.apply_chat_template(chat, add_generation_prompt=True)]

    def ids(self, text: str) -> list[int]:
        return list(self.tok(text, add_special_tokens=False)["input_ids"])

    def text(self, ids: Sequence[int]) -> str:
        # clean_up_tokenization_spaces (on in SmolLM2's tokenizer config) rewrites " ' "
        # to "'" and " ," to ",": `return ' '.join(w)` would reach the sandbox as
        # `return''.join(w)`. Code is text to keep byte for byte.
        return str(
            self.tok.decode(list(ids), skip_special_tokens=True, clean_up_tokenization_spaces=False)
        )


def for_policy(policy: Any) -> TextCodec:
    """The codec of a policy (TinyPolicy or HFPolicy)."""
    tok = getattr(policy, "tokenizer", None)
    if tok is None:
        raise ValueError("the policy has no tokenizer (save one next to the HF model)")
    if hasattr(tok, "bos_id") and hasattr(tok, "eos_id"):
        return ByteCodec(tok)
    return HFCodec(tok)
