"""In-flight weight updates (learner/sampling.py `between_steps`), per-token versions in
trajectories, staleness by the oldest token and the correction of what is admitted."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from learner import staleness
from learner.loss import LossConfig, LossInputs, policy_loss
from learner.sample import Sample
from learner.sampling import sample
from learner.tiny import ByteTokenizer, TinyConfig, TinyPolicy
from schemas.arrays import unpack_i32
from schemas.rollout import Task
from schemas.sandbox import VerifierSpec
from services.rollout import episode
from services.rollout.generator_state import member_id

torch.set_num_threads(1)
V = 8


class FakeModel:
    """A step function whose logits depend on its current `weights`; it logs what it
    returned, so every token's logprob can be checked against the logits it came from."""

    def __init__(self) -> None:
        self.weights = torch.zeros(V)
        self.version = 0
        self.seen: list[torch.Tensor] = []

    def step(self, new_tokens: torch.Tensor, cache: Any) -> tuple[torch.Tensor, Any]:
        logits = self.weights.expand(new_tokens.shape[0], V).clone()
        self.seen.append(logits)
        return logits, cache

    def between(self, swap_at: int) -> Any:
        calls = {"n": 0}

        def hook() -> int | None:
            calls["n"] += 1
            if calls["n"] == swap_at:
                self.weights = torch.linspace(-3, 3, V)  # new weights, loaded in place
                self.version += 1
                return self.version
            return None

        return hook


def test_between_steps_swaps_weights_and_each_token_records_its_version() -> None:
    model = FakeModel()
    out = sample(
        model.step, [1, 2], 3, max_new_tokens=6, eos_id=V + 1, device=torch.device("cpu"),
        generator=torch.Generator().manual_seed(0), between_steps=model.between(3), version=0,
    )  # fmt: skip
    for c in out:
        assert c.versions == [0, 0, 0, 1, 1, 1]  # the hook runs before steps 1..5
        assert len(c.logprobs) == len(c.tokens) == 6


def test_behaviour_logprobs_are_those_of_the_weights_that_drew_each_token() -> None:
    model = FakeModel()
    model.version = 4
    out = sample(
        model.step, [1], 2, max_new_tokens=5, eos_id=V + 1, device=torch.device("cpu"),
        generator=torch.Generator().manual_seed(1), between_steps=model.between(2), version=4,
    )  # fmt: skip
    for row, c in enumerate(out):
        for t, (tok, lp) in enumerate(zip(c.tokens, c.logprobs, strict=True)):
            expected = torch.log_softmax(model.seen[t][row], -1)[tok]
            assert abs(lp - float(expected)) < 1e-6
        old = [lp for lp, v in zip(c.logprobs, c.versions, strict=True) if v == 4]
        assert all(abs(lp - np.log(1 / V)) < 1e-6 for lp in old)  # uniform before the swap
    assert out[0].versions == [4, 4, 5, 5, 5]


def test_tiny_policy_passes_the_hook_and_without_one_versions_are_constant() -> None:
    torch.manual_seed(0)
    policy = TinyPolicy(TinyConfig(dim=16, layers=1, heads=2, max_seq_len=32))
    other = TinyPolicy(TinyConfig(dim=16, layers=1, heads=2, max_seq_len=32)).weights()
    prompt = ByteTokenizer().encode("ab")
    swapped: list[int] = []

    def hook() -> int | None:
        if not swapped:
            policy.load_weights(other)
            swapped.append(1)
            return 9
        return None

    gen = torch.Generator().manual_seed(0)
    out = policy.sample(prompt, 2, max_new_tokens=8, generator=gen, between_steps=hook, version=8)
    assert all(c.versions[0] == 8 and set(c.versions[1:]) <= {9} for c in out)
    plain = policy.sample(prompt, 1, max_new_tokens=4, generator=gen, version=3)[0]
    assert plain.versions == [3] * len(plain.tokens)


def test_trajectory_carries_per_token_versions_of_a_turn() -> None:
    task = Task(
        task_id="t", suite="s", prompt="p", group_size=1,
        verifier=VerifierSpec(name="python_tests", tests="x"),
    )  # fmt: skip
    turn = episode.Turn([5, 6, 7], [-1.0, -1.0, -1.0], 2, "abc", "length", versions=[2, 3, 3])
    traj = episode.trajectory(
        task, group_id="g", index=0, prompt_ids=[1], prompt_text="p", parts=[turn],
        generator_id="gen",
    )  # fmt: skip
    assert list(unpack_i32(traj.policy_versions)) == [2, 3, 3] and traj.policy_version == 2


def _sample(versions: list[int], policy_version: int) -> Sample:
    n = len(versions)
    return Sample(
        trajectory_id="t", group_id="g", prompt=np.zeros(2, np.int32),
        completion=np.ones(n, np.int32), advantage=1.0,
        token_versions=np.array(versions, np.int32), policy_version=policy_version,
    )  # fmt: skip


def test_staleness_is_decided_by_the_oldest_token() -> None:
    s = _sample([3, 3, 5, 5, -1], policy_version=5)  # observation token -1 is ignored
    assert s.version == 3
    assert staleness.stale_reason(staleness.lag(7, s.version), max_lag=4) is None
    # at v8 its newest tokens (v5) are only 3 behind, but the oldest (v3) are 5: dropped
    assert staleness.stale_reason(staleness.lag(8, s.version), max_lag=4) is not None
    assert _sample([-1, -1], policy_version=6).version == 6
    assert _sample([-1], policy_version=-1).version == -1  # unknown: never stale


def test_the_correction_weights_each_admitted_token_by_its_own_behaviour() -> None:
    """Tokens of the newest version are on-policy (weight 1); older ones get pi / mu."""
    cfg = LossConfig(
        clip_eps=0.2, clip_eps_high=None, is_cap=2.0, seq_mask_low=0.01, seq_mask_high=100.0,
        token_mask_low=1e-3, token_mask_high=1e3, kl_coef=0.0, entropy_coef=0.0,
        rwl_coef=1.0, rwl_beta=1.0, rwl_max_weight=20.0,
    )  # fmt: skip
    logp = torch.full((1, 4), -1.0, requires_grad=True)
    behaviour = torch.tensor([[-1.5, -1.5, -1.0, -1.0]])  # two old tokens, two current
    inp = LossInputs(
        logp=logp, mask=torch.ones(1, 4), advantages=torch.tensor([1.0]),
        behaviour_logp=behaviour, has_behaviour=torch.tensor([True]),
    )  # fmt: skip
    loss, stats = policy_loss(inp, cfg)
    loss.backward()
    assert logp.grad is not None
    w_old = float(np.exp(0.5))
    expected = torch.tensor([[-w_old, -w_old, -1.0, -1.0]]) / 4
    torch.testing.assert_close(logp.grad, expected)
    assert stats.sums["truncated"] == 0.0


def test_member_ids_are_stable_per_group_and_index() -> None:
    gid = "0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b"
    assert member_id(gid, 0) == member_id(gid, 0) != member_id(gid, 1)
    assert member_id(gid, 0)[:18] == gid[:18]  # the time prefix stays
    assert len({member_id("not-a-uuid", i) for i in range(8)}) == 8
