"""SmolLM2 as a policy: behaviour logprobs of the fast sampler equal a recomputed forward
pass under the same weights, and a generator-side policy hot-swaps to weights published
through the store (bf16 and fp32 blobs), its next sample scored by the new weights."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from learner.hf import HFPolicy
from learner.publish import snapshot
from learner.weights import DirWeightStore, fetch

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

PROMPT = [{"role": "user", "content": "Write a Python function add(a, b) returning a + b."}]


@pytest.fixture(scope="module")
def smollm2_dir() -> Path:
    from services.infra.models import resolve
    from services.settings import load

    path = resolve("smollm2", load().stack.cache_dir)
    assert path is not None
    return path


def prompt_ids(policy: HFPolicy) -> list[int]:
    return list(policy.tokenizer.apply_chat_template(PROMPT, add_generation_prompt=True))


def max_gap(policy: HFPolicy, prompt: list[int], completion: Any) -> float:
    ids = torch.tensor([prompt + completion.tokens])
    with torch.no_grad():
        logp, _ = policy.token_logprobs(ids)
    return float((logp[0, len(prompt) - 1 :] - torch.tensor(completion.logprobs)).abs().max())


def test_behaviour_logprobs_equal_a_recomputed_forward(smollm2_dir: Path) -> None:
    torch.set_num_threads(2)
    policy = HFPolicy.from_path(smollm2_dir, dtype="float32", sample_dtype="float32")
    prompt = prompt_ids(policy)
    g = torch.Generator().manual_seed(0)
    outs = policy.sample(prompt, 2, max_new_tokens=24, top_p=0.95, generator=g, stop=["\n```\n"])
    assert all(c.tokens for c in outs)
    for c in outs:
        ids = torch.tensor([prompt + c.tokens])
        with torch.no_grad():
            logits = policy.model(input_ids=ids).logits[0, len(prompt) - 1 : -1]
        from learner.sampling import nucleus_logprobs

        want = nucleus_logprobs(logits, 1.0, 0.95).gather(-1, torch.tensor(c.tokens)[:, None])
        assert float((want[:, 0] - torch.tensor(c.logprobs)).abs().max()) < 1e-3


def test_hot_swap_to_published_weights(smollm2_dir: Path, tmp_path: Path) -> None:
    torch.set_num_threads(2)
    learner = HFPolicy.from_path(smollm2_dir, dtype="float32")
    generator = HFPolicy.from_path(smollm2_dir, dtype="float32", sample_dtype="float32")
    prompt = prompt_ids(generator)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in learner.model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.02)  # a clearly different policy
    store = DirWeightStore(tmp_path, "smollm2")
    for version, dtype in enumerate(("bfloat16", "float32")):
        ref = store.put(version, snapshot(learner, dtype))
        generator.load_weights(fetch(ref.uri, ref.sha256))
        out = generator.sample(prompt, 2, max_new_tokens=12, generator=g)
        published = HFPolicy.from_path(smollm2_dir, dtype="float32")
        published.load_weights(snapshot(learner, dtype))  # the weights the blob holds
        base = HFPolicy.from_path(smollm2_dir, dtype="float32")
        for c in out:
            assert max_gap(published, prompt, c) < 1e-3
            assert max_gap(base, prompt, c) > 1e-2  # not the old weights


def test_completion_text_keeps_code_byte_for_byte(smollm2_dir: Path) -> None:
    from transformers import AutoTokenizer

    from services.rollout.textcodec import HFCodec

    codec = HFCodec(AutoTokenizer.from_pretrained(smollm2_dir))
    code = "def f(words, n) :\n    return ' '.join(words) , n . real  # it 's , here ?\n"
    assert codec.text(codec.ids(code)) == code


def test_smollm2_samples_in_int4_with_lora_and_swaps_adapters(smollm2_dir: Path) -> None:
    """SmolLM2's layers come from a Q4_1 GGUF, so they are on the int4 grid and `auto`
    samples in int4 with LoRA on; a published adapter update reaches the sampler (adapters
    beside the base, not rounded into it) and its logprobs stay near the learner's."""
    from learner import quant
    from learner.hf import LoraSpec

    if not quant.available():
        pytest.skip("torch lacks the int4 CPU kernels")
    torch.set_num_threads(2)
    lora = LoraSpec(8, 16.0, ("q_proj", "v_proj", "down_proj"))
    generator = HFPolicy.from_path(smollm2_dir, dtype="float32", sample_dtype="auto", lora=lora)
    before = generator.decoder()
    assert before is not None and before.int4
    learner = HFPolicy.from_path(smollm2_dir, dtype="float32", lora=lora)
    g = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for name, p in learner.model.named_parameters():
            if "lora_B" in name:
                p.add_(torch.randn(p.shape, generator=g) * 0.02)
    generator.load_weights(learner.weights())
    after = generator.decoder()
    assert after is not before and after.layers[3].qkv.base is before.layers[3].qkv.base
    prompt = prompt_ids(generator)
    out = generator.sample(prompt, 2, max_new_tokens=12, generator=g)
    base = HFPolicy.from_path(smollm2_dir, dtype="float32")
    for c in out:
        assert max_gap(learner, prompt, c) < 0.5  # bf16 activations, 8-bit head
        assert max_gap(base, prompt, c) > max_gap(learner, prompt, c)
