"""learner/decode.py on a small random Llama: its behaviour logprobs are those of the
model's own forward (same weights, same dtype), greedy decoding is transformers' greedy
decoding, LoRA deltas are merged, stop strings end a row at the completing token."""

from __future__ import annotations

from typing import Any

import pytest
import torch

pytest.importorskip("transformers")

from learner.decode import Decoder, generate
from learner.hf import HFPolicy, LoraSpec
from learner.sampling import nucleus_logprobs
from learner.stops import StopStrings

PROMPT = [5, 17, 3, 99, 42, 7]


def tiny_llama(seed: int = 0) -> Any:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                      tie_word_embeddings=True, eos_token_id=1, pad_token_id=1)  # fmt: skip
    return LlamaForCausalLM(cfg).eval()


def recomputed(policy: HFPolicy, tokens: list[int], temperature: float, top_p: float) -> Any:
    """Per-token logprobs of the completion under the sampling distribution, from one full
    forward pass (no cache)."""
    ids = torch.tensor([PROMPT + tokens])
    with torch.no_grad():
        logits = policy.model(input_ids=ids).logits[0, len(PROMPT) - 1 : -1]
    dist = nucleus_logprobs(logits, temperature, top_p)
    return dist.gather(-1, torch.tensor(tokens)[:, None]).squeeze(-1)


@pytest.mark.parametrize(("temperature", "top_p"), [(1.0, 1.0), (0.7, 0.9)])
def test_behaviour_logprobs_match_a_full_forward(temperature: float, top_p: float) -> None:
    policy = HFPolicy(tiny_llama(), "tiny-llama", sample_dtype="float32")
    g = torch.Generator().manual_seed(0)
    outs = policy.sample(PROMPT, 4, max_new_tokens=20, temperature=temperature, top_p=top_p,
                         generator=g)  # fmt: skip
    assert len(outs) == 4 and all(c.tokens for c in outs)
    for c in outs:
        assert len(c.tokens) == len(c.logprobs)
        want = recomputed(policy, c.tokens, temperature, top_p)
        assert torch.allclose(torch.tensor(c.logprobs), want, atol=1e-4)
        assert c.finish_reason == ("stop" if c.tokens[-1] == policy.eos_id else "length")


def test_greedy_is_transformers_greedy() -> None:
    model = tiny_llama(1)
    policy = HFPolicy(model, "tiny-llama", sample_dtype="float32")
    (ours,) = policy.sample(PROMPT, 1, max_new_tokens=16, temperature=0.0)
    with torch.no_grad():
        out = model.generate(torch.tensor([PROMPT]), do_sample=False, max_new_tokens=16,
                             eos_token_id=policy.eos_id, pad_token_id=policy.pad_id)  # fmt: skip
    assert ours.tokens == out[0, len(PROMPT) :].tolist()


def test_bf16_sampling_weights_are_the_ones_whose_logprobs_are_reported() -> None:
    policy = HFPolicy(tiny_llama(2), "tiny-llama", sample_dtype="bfloat16")
    dec = policy.decoder()
    assert dec is not None and dec.dtype == torch.bfloat16
    g = torch.Generator().manual_seed(3)
    outs = policy.sample(PROMPT, 3, max_new_tokens=12, generator=g)
    bf16 = HFPolicy(tiny_llama(2).to(torch.bfloat16), "tiny-llama", sample_dtype="bfloat16")
    fp32_gap = []
    for c in outs:
        want = recomputed(bf16, c.tokens, 1.0, 1.0)
        assert torch.allclose(torch.tensor(c.logprobs), want, atol=0.05)  # bf16 kernels differ
        fp32_gap.append((recomputed(policy, c.tokens, 1.0, 1.0) - torch.tensor(c.logprobs)).abs())
    assert float(torch.cat(fp32_gap).mean()) < 0.05


def test_decoder_repacks_after_a_weight_change_and_merges_lora() -> None:
    lora = LoraSpec(rank=4, alpha=8.0, targets=("q_proj", "v_proj", "down_proj"))
    policy = HFPolicy(tiny_llama(), "tiny-llama", sample_dtype="float32", lora=lora)
    first = policy.decoder()
    assert policy.decoder() is first  # cached while the weights do not change
    state = policy.weights()
    assert state and all("lora_" in k for k in state)
    g = torch.Generator().manual_seed(4)
    policy.load_weights({k: torch.randn(v.shape, generator=g) * 0.3 for k, v in state.items()})
    assert policy.decoder() is not first
    outs = policy.sample(PROMPT, 2, max_new_tokens=10, generator=g)
    for c in outs:
        want = recomputed(policy, c.tokens, 1.0, 1.0)
        assert torch.allclose(torch.tensor(c.logprobs), want, atol=1e-4)
    with pytest.raises(KeyError, match="LoRA weights"):
        policy.load_weights({k: v for k, v in list(state.items())[1:]})


def test_lora_trains_only_the_adapters() -> None:
    lora = LoraSpec(rank=2, alpha=4.0, targets=("q_proj",))
    policy = HFPolicy(tiny_llama(), "tiny-llama", lora=lora)
    names = [n for n, p in policy.model.named_parameters() if p.requires_grad]
    assert names and all("lora_" in n for n in names)
    assert policy.spec()["lora"] == {"rank": 2, "alpha": 4.0, "targets": ("q_proj",)}


def test_stop_strings_end_a_row_at_the_completing_token() -> None:
    text = {i: chr(ord("a") + i % 26) for i in range(128)}
    text[60] = "`"
    stops = StopStrings(["x``"], lambda ids: "".join(text[i] for i in ids))
    assert not stops.hit([0, 1, 2, 23])  # "abcx"
    assert stops.first_hit([0, 23, 60, 60, 4, 60]) == 4  # "ax``" completed by token 4
    dec = Decoder(tiny_llama(), torch.float32)
    g = torch.Generator().manual_seed(5)
    free = generate(dec, PROMPT, 4, max_new_tokens=12, eos_id=-1, generator=g)
    token = free[0].tokens[2]  # a token the model draws: stop at its first appearance
    stop = StopStrings([text[token]], lambda ids: "".join(text[i] for i in ids))
    g = torch.Generator().manual_seed(5)
    cut = generate(dec, PROMPT, 4, max_new_tokens=12, eos_id=-1, generator=g, stops=stop)
    assert cut[0].tokens == free[0].tokens[: len(cut[0].tokens)]  # same draws until then
    assert cut[0].finish_reason == "stop" and len(cut[0].tokens) <= 3
    for c in cut:
        end = stop.first_hit(c.tokens)
        assert (end, c.finish_reason) in ((len(c.tokens), "stop"), (None, "length"))


def test_fast_decoder_calls_between_steps_and_samples_with_the_swapped_weights() -> None:
    """In-flight updates through the fast decoder: the hook runs between decoding steps,
    the tokens after a swap record its version and their logprobs are the new weights'
    (the KV cache of the tokens before stays as computed)."""
    policy = HFPolicy(tiny_llama(0), "tiny-llama", sample_dtype="float32")
    assert policy.decoder() is not None
    newer = tiny_llama(7).state_dict()
    calls: list[int] = []

    def hook() -> int | None:
        calls.append(1)
        if len(calls) == 3:
            policy.load_weights(newer)
            return 6
        return None

    g = torch.Generator().manual_seed(8)
    (c,) = policy.sample(PROMPT, 1, max_new_tokens=8, generator=g, between_steps=hook, version=5)
    assert len(c.tokens) == 8 and len(calls) == 7  # between every two of the 8 steps
    assert c.versions == [5, 5, 5, 6, 6, 6, 6, 6]
    old = HFPolicy(tiny_llama(0), "tiny-llama", sample_dtype="float32")
    want_old = recomputed(old, c.tokens, 1.0, 1.0)
    assert torch.allclose(torch.tensor(c.logprobs[:3]), want_old[:3], atol=1e-4)
    assert not torch.allclose(torch.tensor(c.logprobs[3:]), want_old[3:], atol=1e-3)
    plain = policy.sample(PROMPT, 2, max_new_tokens=4, generator=g, version=3)
    assert all(p.versions == [3] * len(p.tokens) for p in plain)


def test_draw_follows_the_distribution_and_never_draws_outside_the_nucleus() -> None:
    from learner.sampling import draw

    logits = torch.tensor([[2.0, 1.0, 0.5, -1.0, 0.0, 3.0]]).repeat(4, 1)
    dist = nucleus_logprobs(logits, 1.0, 0.8)
    outside = torch.isinf(dist[0])
    assert outside.any()  # the test has tokens outside the nucleus
    gen = torch.Generator().manual_seed(0)
    n = 20_000
    drawn = torch.cat([draw(dist, gen) for _ in range(n // 4)])
    counts = torch.bincount(drawn, minlength=6).double() / n
    assert counts[outside].sum() == 0
    expected = dist[0].exp().double()
    se = (expected * (1 - expected) / n).sqrt()
    assert ((counts - expected).abs() <= 5 * se + 1e-12).all(), (counts, expected)
    again = torch.cat([draw(dist, torch.Generator().manual_seed(0)) for _ in range(1)])
    assert torch.equal(again, drawn[:4])  # a seeded generator reproduces the draws
