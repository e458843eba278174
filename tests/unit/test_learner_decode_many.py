"""learner/decode.generate_many on a small random Llama: prompts of different lengths
left-padded into one batch decode as each would alone (greedy tokens equal transformers'
greedy on the unpadded prompt; sampled rows' logprobs equal a full forward of that row), and
each row ends at its own stop strings."""

from __future__ import annotations

import shutil

import pytest
import torch

pytest.importorskip("transformers")

from learner.decode import Decoder, Draw, generate, generate_many
from learner.sampling import nucleus_logprobs
from learner.stops import StopStrings
from tests.unit.test_learner_decode import tiny_llama

PROMPTS = [[5, 17, 3, 99, 42, 7], [8, 9], [100, 2, 64, 31], [77]]


def test_greedy_rows_decode_as_each_prompt_alone_and_as_transformers() -> None:
    model = tiny_llama(1)
    dec = Decoder(model, torch.float32)
    rows = generate_many(dec, PROMPTS, Draw(max_new_tokens=12, eos_id=-1, temperature=0.0))
    assert [len(r.tokens) for r in rows] == [12] * len(PROMPTS)
    for prompt, row in zip(PROMPTS, rows, strict=True):
        (alone,) = generate(dec, prompt, 1, max_new_tokens=12, eos_id=-1, temperature=0.0)
        assert row.tokens == alone.tokens
        with torch.no_grad():
            out = model.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=12,
                                 eos_token_id=None, pad_token_id=1)  # fmt: skip
        assert row.tokens == out[0, len(prompt) :].tolist()


def test_sampled_rows_report_the_logprobs_of_their_own_unpadded_forward() -> None:
    model = tiny_llama(2)
    dec = Decoder(model, torch.float32)
    how = Draw(max_new_tokens=10, eos_id=-1, temperature=0.8, top_p=0.95,
               generator=torch.Generator().manual_seed(4))  # fmt: skip
    rows = generate_many(dec, PROMPTS + PROMPTS[:1], how)
    assert len(rows) == len(PROMPTS) + 1
    for prompt, row in zip(PROMPTS + PROMPTS[:1], rows, strict=True):
        ids = torch.tensor([prompt + row.tokens])
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1]
        want = nucleus_logprobs(logits, 0.8, 0.95).gather(-1, torch.tensor(row.tokens)[:, None])
        assert torch.allclose(torch.tensor(row.logprobs), want.squeeze(-1), atol=1e-4)


def test_each_row_stops_at_its_own_stop_strings_and_the_rest_go_on() -> None:
    dec = Decoder(tiny_llama(3), torch.float32)
    greedy = Draw(max_new_tokens=10, eos_id=-1, temperature=0.0)
    free = generate_many(dec, PROMPTS, greedy)
    text = {i: f"<{i}>" for i in range(128)}
    decode = lambda ids: "".join(text[i] for i in ids)  # noqa: E731
    stops = [StopStrings([text[free[0].tokens[1]]], decode), None, None,
             StopStrings([text[free[3].tokens[4]]], decode)]  # fmt: skip
    cut = generate_many(dec, PROMPTS, greedy, stops)
    for f, c, s in zip(free, cut, stops, strict=True):
        end = s.first_hit(f.tokens) if s is not None else None
        assert c.tokens == f.tokens[: end or len(f.tokens)]
        assert c.finish_reason == ("stop" if end is not None else "length")
    assert len(cut[0].tokens) <= 2 and len(cut[1].tokens) == 10


def test_int4_rows_decode_as_each_prompt_alone() -> None:
    from learner import quant

    if not quant.available():
        pytest.skip("torch's int4 CPU kernels are not available here")
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=128, hidden_size=128, intermediate_size=256,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      tie_word_embeddings=True, eos_token_id=1, pad_token_id=1)  # fmt: skip
    dec = Decoder(LlamaForCausalLM(cfg).eval(), torch.float32, int4=True)
    greedy = Draw(max_new_tokens=8, eos_id=-1, temperature=0.0)
    rows = generate_many(dec, PROMPTS, greedy)
    for prompt, row in zip(PROMPTS, rows, strict=True):
        (alone,) = generate(dec, prompt, 1, max_new_tokens=8, eos_id=-1, temperature=0.0)
        assert row.tokens == alone.tokens


class _Text:
    """Token i reads "<i>": a tokenizer (decode) and a codec (text) for the tiny Llama."""

    tok = None

    def decode(self, ids: list[int], **kw: object) -> str:
        return self.text(ids)

    def text(self, ids: list[int]) -> str:
        return "".join(f"<{i}>" for i in ids)


def test_evaluation_batches_decode_as_transformers_generate() -> None:
    """services/rollout/batched: the fast decoder's rows are HF `generate`'s (left-padded
    there too), cut at the same stops, in the model's dtype whatever the generators sample
    in; a policy without a decoder takes `generate`."""
    from learner.hf import HFPolicy
    from services.rollout.batched import Decoding, complete_ids

    class NoDecoder(HFPolicy):
        def decoder(self, exact: bool = False) -> None:
            return None

    model, text = tiny_llama(4), _Text()
    fast = HFPolicy(model, "tiny-llama", sample_dtype="bfloat16")
    slow = NoDecoder(model, "tiny-llama", sample_dtype="float32")
    free = complete_ids(fast, text, PROMPTS, [()] * 4, 1, Decoding(9, batch=3))
    stop = text.text(free[2][0].tokens[3:5])  # the third row ends by its 5th token
    end = StopStrings([stop], text.text).first_hit(free[2][0].tokens)
    stops = [(), ("<127><127>",), (stop,), ()]
    for policy in (fast, slow):
        policy.tokenizer = text
    rows = [complete_ids(p, text, PROMPTS, stops, 1, Decoding(9, batch=3)) for p in (fast, slow)]
    assert [[d.tokens for d in r] for r in rows[0]] == [[d.tokens for d in r] for r in rows[1]]
    assert end is not None and end <= 5
    assert rows[0][2][0].tokens == free[2][0].tokens[:end]
    assert rows[0][2][0].finish_reason == "stop"
    assert [len(r[0].tokens) for r in rows[0]][:2] == [9, 9]
    assert fast._decoder is not None and fast._decoder.dtype == torch.float32


def test_a_compiled_step_samples_as_the_eager_one_and_survives_weight_versions() -> None:
    """learner.sample_compile: the same draws and logprobs as the eager step (int4 base,
    LoRA beside it), and a later weight version's decoder reuses the compiled code."""
    from torch._dynamo.utils import counters

    from learner import quant
    from learner.hf import HFPolicy, LoraSpec
    from tests.unit.test_learner_quant import snapped_llama

    if not quant.available():
        pytest.skip("torch's int4 CPU kernels are not available here")
    if shutil.which("g++") is None and shutil.which("c++") is None:
        pytest.skip("torch.compile's CPU backend needs a C++ compiler")
    lora = LoraSpec(rank=2, alpha=4.0, targets=("q_proj", "v_proj"))
    eager = HFPolicy(snapped_llama(), "tiny-llama", sample_dtype="int4", lora=lora)
    fast = HFPolicy(snapped_llama(), "tiny-llama", sample_dtype="int4", lora=lora,
                    sample_compile=True)  # fmt: skip

    def draws(policy: HFPolicy) -> list[tuple[list[int], list[float]]]:
        g = torch.Generator().manual_seed(6)
        outs = policy.sample(PROMPTS[0], 3, max_new_tokens=6, generator=g)
        return [(c.tokens, c.logprobs) for c in outs]

    graphs: list[int] = []
    for _ in range(2):
        want, got = draws(eager), draws(fast)
        assert fast._decoder.compiled and not eager._decoder.compiled
        assert [t for t, _ in got] == [t for t, _ in want]
        # the int4 kernels take bf16 activations, rounded where the fused code rounds them:
        # within a few 1e-3 (the int4 route is 0.037 per token from the learner's fp32)
        assert torch.allclose(torch.tensor([lp for _, lp in got]),
                              torch.tensor([lp for _, lp in want]), atol=5e-3)  # fmt: skip
        graphs.append(counters["stats"]["unique_graphs"])
        with torch.no_grad():  # an optimizer step on the adapters, in both policies
            for policy in (eager, fast):
                for p in policy.model.parameters():
                    if p.requires_grad:
                        p.add_(0.05)
    assert graphs[1] == graphs[0]  # the second version's decoder compiled nothing
