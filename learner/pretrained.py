"""Pretrained causal LMs from GGUF files: converted once to a plain Hugging Face directory
(safetensors weights + tokenizer files), so that transformers can fine-tune them.

transformers loads a GGUF file with `from_pretrained(dir, gguf_file=...)`, dequantising its
tensors to float; a model loaded that way is re-saved here as safetensors (no pickle) with
its tokenizer, and every later load reads the directory. The directory is keyed by the GGUF
file's sha256, written under a temporary name and renamed into place, so concurrent
converters (a learner and a generator starting together) never see half a model.

Chat models packed as GGUF often carry the wrong end-of-sequence token in their metadata
(SmolLM2-Instruct's says `<|im_start|>`); `fix_special_tokens` sets the end of a chat turn
as EOS when the chat template uses one.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

MANIFEST = "rollstream-model.json"
"""Written last into a converted directory: its source and sha256 (a directory without it
is incomplete)."""
CHAT_TURN_ENDS = ("<|im_end|>", "<|eot_id|>", "<|end|>", "<end_of_turn>")
"""End-of-turn tokens of common chat templates, preferred as EOS when the vocabulary has one."""


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def converted_dir(gguf: Path, cache_dir: Path, digest: str | None = None) -> Path:
    """Where the conversion of `gguf` lives (whether or not it exists yet)."""
    return cache_dir / f"gguf-{(digest or sha256_file(gguf))[:24]}"


def is_complete(model_dir: Path) -> bool:
    return (model_dir / MANIFEST).is_file()


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def fix_special_tokens(tokenizer: Any) -> None:
    """EOS = the chat template's end-of-turn token when the vocabulary has one; a pad token
    (the EOS) when there is none."""
    template = getattr(tokenizer, "chat_template", None) or ""
    vocab = tokenizer.get_vocab()
    for token in CHAT_TURN_ENDS:
        if token in vocab and token in template:
            tokenizer.eos_token = token
            break
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token


def convert_gguf(gguf: Path, cache_dir: Path, dtype: str = "float32") -> Path:
    """The converted directory of `gguf` (converting it now if needed). Idempotent and safe
    to call from several processes at once."""
    digest = sha256_file(gguf)
    out = converted_dir(gguf, cache_dir, digest)
    if is_complete(out):
        return out
    with _locked(cache_dir / ".convert.lock"):
        if is_complete(out):
            return out
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        tmp = out.with_name(out.name + f".partial-{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)  # type: ignore[no-untyped-call]
        fix_special_tokens(tokenizer)
        model = AutoModelForCausalLM.from_pretrained(
            gguf.parent, gguf_file=gguf.name, dtype=getattr(torch, dtype)
        )
        if model.generation_config is not None:
            model.generation_config.eos_token_id = tokenizer.eos_token_id
            model.generation_config.pad_token_id = tokenizer.pad_token_id
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        manifest = {"source": str(gguf), "sha256": digest, "dtype": dtype,
                    "eos_token": tokenizer.eos_token}  # fmt: skip
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
        shutil.rmtree(out, ignore_errors=True)
        tmp.rename(out)
    return out
