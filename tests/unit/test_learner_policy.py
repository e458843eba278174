"""The built-in tiny policy and the sampler: logprobs agree between sampling and training."""

from __future__ import annotations

import math

import pytest
import torch

from learner.policy import Policy, logprobs_from_logits
from learner.sampling import nucleus_logprobs
from learner.spec import build_policy
from learner.tiny import ByteTokenizer, TinyConfig, TinyPolicy

torch.set_num_threads(1)
CFG = TinyConfig(dim=32, layers=2, heads=2, max_seq_len=48)


@pytest.fixture
def policy() -> TinyPolicy:
    torch.manual_seed(0)
    return TinyPolicy(CFG)


def test_protocol_and_spec_round_trip(policy: TinyPolicy) -> None:
    assert isinstance(policy, Policy)
    clone = build_policy(policy.spec())
    clone.load_weights(policy.weights())
    tokens = torch.randint(0, 256, (2, 10))
    a, _ = policy.token_logprobs(tokens)
    b, _ = clone.token_logprobs(tokens)
    torch.testing.assert_close(a, b)
    assert a.shape == (2, 9) and a.dtype == torch.float32 and bool((a < 0).all())


def test_sampled_logprobs_match_training_logprobs(policy: TinyPolicy) -> None:
    tok = ByteTokenizer()
    prompt = tok.encode("ab")
    gen = torch.Generator().manual_seed(1)
    outs = policy.sample(prompt, n=3, max_new_tokens=12, generator=gen)
    assert len(outs) == 3
    for out in outs:
        assert 1 <= len(out.tokens) <= 12 and len(out.logprobs) == len(out.tokens)
        seq = torch.tensor([prompt + out.tokens])
        logp, _ = policy.token_logprobs(seq)  # full forward, no KV cache
        torch.testing.assert_close(
            logp[0, len(prompt) - 1 :], torch.tensor(out.logprobs), atol=1e-5, rtol=1e-4
        )
        assert out.finish_reason == ("stop" if out.tokens[-1] == tok.eos_id else "length")


def test_temperature_is_part_of_the_behaviour_distribution(policy: TinyPolicy) -> None:
    prompt = ByteTokenizer().encode("x")
    out = policy.sample(prompt, max_new_tokens=6, temperature=0.7, generator=torch.Generator())[0]
    logp, _ = policy.token_logprobs(torch.tensor([prompt + out.tokens]), temperature=0.7)
    torch.testing.assert_close(
        logp[0, len(prompt) - 1 :], torch.tensor(out.logprobs), atol=1e-5, rtol=1e-4
    )


def test_greedy_is_deterministic(policy: TinyPolicy) -> None:
    a = policy.sample([256, 1, 2], n=2, max_new_tokens=8, temperature=0)
    assert a[0].tokens == a[1].tokens and a[0].logprobs == [0.0] * len(a[0].tokens)


def test_sampling_respects_max_seq_len(policy: TinyPolicy) -> None:
    out = policy.sample(list(range(40)), max_new_tokens=100, temperature=0)[0]
    assert len(out.tokens) <= CFG.max_seq_len - 40
    with pytest.raises(ValueError, match="max_seq_len"):
        policy.token_logprobs(torch.zeros(1, CFG.max_seq_len + 1, dtype=torch.long))


def test_nucleus_renormalises_inside_the_top_p_mass() -> None:
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    lp = nucleus_logprobs(logits, 1.0, top_p=0.7)  # 0.5 + 0.3 reach 0.7: keep two
    torch.testing.assert_close(lp.exp(), torch.tensor([[0.625, 0.375, 0.0, 0.0]]))
    assert math.isinf(float(lp[0, 3]))


def test_entropy_of_uniform_is_log_vocab() -> None:
    logits = torch.zeros(1, 3, 5)
    logp, ent = logprobs_from_logits(logits, torch.zeros(1, 3, dtype=torch.long), with_entropy=True)
    assert ent is not None
    torch.testing.assert_close(ent, torch.full((1, 3), math.log(5)))
    torch.testing.assert_close(logp, torch.full((1, 3), -math.log(5)))


def test_tokenizer_round_trip() -> None:
    tok = ByteTokenizer()
    ids = tok.encode("héllo", eos=True)
    assert ids[0] == tok.bos_id and ids[-1] == tok.eos_id and tok.decode(ids) == "héllo"
