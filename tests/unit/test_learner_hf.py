"""The Hugging Face adapter on a tiny model built from a config (nothing is downloaded)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from learner.config import LearnerSettings
from learner.policy import Policy
from learner.sample import Sample
from learner.spec import build_policy
from learner.trainer import Trainer, train_config
from learner.weights import DirWeightStore

transformers = pytest.importorskip("transformers")
torch.set_num_threads(1)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        eos_token_id=2,
        pad_token_id=0,
    )
    path = tmp_path_factory.mktemp("hf") / "tiny-llama"
    transformers.LlamaForCausalLM(cfg).save_pretrained(path)
    return path


def test_loads_from_a_local_path_and_matches_the_model(model_dir: Path) -> None:
    from learner.hf import HFPolicy

    policy = HFPolicy.from_path(model_dir)
    assert isinstance(policy, Policy)
    assert (policy.vocab_size, policy.eos_id, policy.pad_id, policy.max_seq_len) == (64, 2, 0, 64)
    tokens = torch.randint(3, 64, (2, 9))
    logp, ent = policy.token_logprobs(tokens, torch.ones_like(tokens), with_entropy=True)
    logits = policy.model(input_ids=tokens).logits
    expected = torch.log_softmax(logits[:, :-1].float(), -1).gather(-1, tokens[:, 1:, None])[..., 0]
    torch.testing.assert_close(logp, expected)
    assert ent is not None and ent.shape == (2, 8) and bool((ent > 0).all())


def test_sampling_with_kv_cache_matches_training_logprobs(model_dir: Path) -> None:
    policy = build_policy({"kind": "hf", "path": str(model_dir)})
    prompt = [5, 6, 7]
    outs = policy.sample(prompt, n=2, max_new_tokens=6, generator=torch.Generator().manual_seed(0))
    for out in outs:
        logp, _ = policy.token_logprobs(torch.tensor([prompt + out.tokens]))
        torch.testing.assert_close(logp[0, 2:], torch.tensor(out.logprobs), atol=1e-4, rtol=1e-4)


TRACE = Sample("t", "g", np.array([5, 6], np.int32), np.array([10, 11, 12, 2], np.int32), 1.0)
"""A positively scored trace without behaviour logprobs (reward-weighted likelihood)."""
TRACE_SEQ = torch.tensor([[5, 6, 10, 11, 12, 2]])


def trace_logp(policy: Policy) -> float:
    """Log-likelihood of TRACE's tokens under the policy."""
    with torch.no_grad():
        return float(policy.token_logprobs(TRACE_SEQ)[0][0, 1:].sum())


def test_trains_and_round_trips_through_the_weight_store(model_dir: Path, tmp_path: Path) -> None:
    policy = build_policy({"kind": "hf", "path": str(model_dir)})
    trainer = Trainer(policy, train_config(LearnerSettings(lr=1e-2)), torch.device("cpu"))
    before = trace_logp(policy)
    for _ in range(3):
        res = trainer.step([TRACE])  # no behaviour logprobs: reward-weighted likelihood
    assert res.stats["rwl_loss"] > 0 and res.stats["ratio_mean"] == 0  # no IS tokens
    after = trace_logp(policy)
    assert after > before  # a positively scored trace became more likely
    ref = DirWeightStore(tmp_path, "hf").put(1, policy.weights())
    clone = build_policy(policy.spec())
    clone.load_weights(DirWeightStore(tmp_path, "hf").get(ref.uri, ref.sha256))
    with torch.no_grad():
        torch.testing.assert_close(
            clone.token_logprobs(TRACE_SEQ)[0], policy.token_logprobs(TRACE_SEQ)[0]
        )


def test_cpu_amp_trains_in_bf16_with_float32_weights(
    model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from learner import trainer as trainer_mod
    from learner.trainer import autocast_dtype

    cpu = torch.device("cpu")
    assert autocast_dtype(cpu, amp=True, cpu_amp=False) is None
    monkeypatch.setattr(trainer_mod, "fast_bf16_cpu", lambda: False)
    assert autocast_dtype(cpu, amp=True, cpu_amp=True) is None
    # where bf16 pays (measured at start); autocast itself runs on any CPU, emulated or not
    monkeypatch.setattr(trainer_mod, "fast_bf16_cpu", lambda: True)
    assert autocast_dtype(cpu, amp=True, cpu_amp=True) is torch.bfloat16
    policy = build_policy({"kind": "hf", "path": str(model_dir)})
    trainer = Trainer(policy, train_config(LearnerSettings(lr=1e-2, cpu_amp=True)), cpu)
    assert trainer.amp_dtype is torch.bfloat16
    before = trace_logp(policy)
    for _ in range(3):
        trainer.step([TRACE])
    assert all(p.dtype == torch.float32 for p in policy.trainable_parameters())
    after = trace_logp(policy)
    assert after > before


def _group(prompt: list[int], tails: list[list[int]]) -> list[Sample]:
    """A group's samples: one prompt, completions of different lengths, behaviour logprobs."""
    rng = np.random.default_rng(1)
    p = np.array(prompt, np.int32)
    return [
        Sample(f"t{i}", "g", p, np.array(c, np.int32), float(rng.normal()),
               behaviour_logp=rng.normal(-3.0, 0.5, len(c)).astype(np.float32), policy_version=0)
        for i, c in enumerate(tails)
    ]  # fmt: skip


GROUP_TAILS = [[10, 11, 12, 2], [13, 14], [15, 16, 17, 18, 19, 2], [20]]


def test_a_shared_prompt_runs_once_with_the_same_logprobs(model_dir: Path) -> None:
    from learner.sample import collate

    policy = build_policy({"kind": "hf", "path": str(model_dir)})
    batch = collate(_group([5, 6, 7, 8, 9], GROUP_TAILS), policy.pad_id, "cpu")
    real = batch.attention_mask[:, 1:].bool()
    with torch.no_grad():
        plain, plain_ent = policy.token_logprobs(
            batch.tokens, batch.attention_mask, with_entropy=True
        )
        shared, shared_ent = policy.token_logprobs(
            batch.tokens, batch.attention_mask, with_entropy=True, shared_prefix=5
        )
    assert shared.shape == plain.shape and shared_ent is not None and plain_ent is not None
    torch.testing.assert_close(shared[real], plain[real], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(shared_ent[real], plain_ent[real], atol=1e-5, rtol=1e-5)


def test_share_prompt_takes_the_same_step_as_padding_every_row(model_dir: Path) -> None:
    samples = _group([5, 6, 7, 8, 9], GROUP_TAILS) + _group([30, 31, 32], [[40, 41], [42, 2]])
    after = {}
    for share in (False, True):
        torch.manual_seed(0)
        policy = build_policy({"kind": "hf", "path": str(model_dir)})
        cfg = LearnerSettings(lr=1e-3, share_prompt=share, micro_batch_tokens=24)
        trainer = Trainer(policy, train_config(cfg), torch.device("cpu"))
        res = trainer.step(samples)
        after[share] = (res.stats["loss"], policy.weights())
    assert after[True][0] == pytest.approx(after[False][0], rel=1e-5, abs=1e-7)
    for name, w in after[False][1].items():
        torch.testing.assert_close(after[True][1][name], w, atol=1e-6, rtol=1e-5)
