"""Gradients of the learner's loss against hand-computed cases."""

from __future__ import annotations

import math

import pytest
import torch

from learner.config import configure
from learner.loss import LossConfig, LossInputs, LossStats, policy_loss

torch.set_num_threads(1)


def _inputs(
    logp: list[list[float]],
    behaviour: list[list[float]] | None,
    adv: list[float],
    mask: list[list[float]] | None = None,
    **extra: torch.Tensor,
) -> LossInputs:
    lp = torch.tensor(logp, dtype=torch.float64, requires_grad=True)
    m = torch.tensor(mask) if mask is not None else torch.ones_like(lp.detach())
    has_b = torch.tensor([behaviour is not None] * len(adv))
    b = (
        torch.tensor(behaviour, dtype=torch.float64)
        if behaviour is not None
        else torch.zeros_like(m)
    )
    return LossInputs(lp, m, torch.tensor(adv), b, has_b, **extra)


def _grad(inp: LossInputs, cfg: LossConfig, num_tokens: float | None = None) -> torch.Tensor:
    loss, _ = policy_loss(inp, cfg, num_tokens)
    loss.backward()
    assert inp.logp.grad is not None
    return inp.logp.grad


def test_on_policy_reduces_to_plain_policy_gradient() -> None:
    logp = [[-0.5, -1.2, -2.0], [-0.1, -0.3, -0.7]]
    inp = _inputs(logp, logp, [1.5, -0.5], mask=[[1, 1, 0], [1, 1, 1]])
    grad = _grad(inp, configure(LossConfig))
    # plain policy gradient: loss = -sum(A * logp * mask) / N, N = 5 trained tokens
    plain = torch.tensor(logp, dtype=torch.float64, requires_grad=True)
    adv = torch.tensor([[1.5], [-0.5]], dtype=torch.float64)
    (-(adv * plain * torch.tensor([[1, 1, 0], [1, 1, 1]])).sum() / 5).backward()
    assert plain.grad is not None
    torch.testing.assert_close(grad, plain.grad)
    torch.testing.assert_close(grad[0, :2], torch.full((2,), -1.5 / 5, dtype=torch.float64))


def test_on_policy_gradient_wrt_logits_is_softmax_policy_gradient() -> None:
    logits = torch.tensor([[0.2, -0.4, 1.0]], dtype=torch.float64, requires_grad=True)
    action, adv = 2, 0.7
    logp = torch.log_softmax(logits, -1)[:, action][:, None]
    inp = LossInputs(
        logp, torch.ones(1, 1), torch.tensor([adv]), logp.detach(), torch.tensor([True])
    )
    loss, _ = policy_loss(inp, configure(LossConfig))
    loss.backward()
    expected = -adv * (torch.nn.functional.one_hot(torch.tensor(action), 3) - logits.softmax(-1))
    assert logits.grad is not None
    torch.testing.assert_close(logits.grad, expected)


def test_importance_weight_scales_the_gradient() -> None:
    # behaviour logp lower than current: w = exp(0.3) (under the cap of 2)
    inp = _inputs([[-1.0, -2.0]], [[-1.3, -2.1]], [2.0])
    grad = _grad(inp, configure(LossConfig))
    expected = torch.tensor([[-2.0 * math.exp(0.3) / 2, -2.0 * math.exp(0.1) / 2]])
    torch.testing.assert_close(grad, expected.double())


def test_importance_weight_is_truncated_at_the_cap() -> None:
    inp = _inputs([[-1.0, -1.0]], [[-2.0, -1.0]], [1.0])  # w = e (> cap 2), then 1
    cfg = configure(LossConfig, is_cap=2.0, seq_mask_high=10.0)
    loss, stats = policy_loss(inp, cfg)
    loss.backward()
    assert inp.logp.grad is not None
    torch.testing.assert_close(inp.logp.grad, torch.tensor([[-2.0 / 2, -1.0 / 2]]).double())
    means = stats.means()
    assert means["trunc_frac"] == 0.5
    assert means["is_weight_mean"] == pytest.approx(1.5)
    assert means["ratio_mean"] == pytest.approx((math.e + 1) / 2)
    assert means["ratio_max"] == pytest.approx(math.e)


@pytest.mark.parametrize(
    ("behaviour", "why"),
    [([[-1.0 - 1.0, -1.0 - 1.0]], "geometric mean e > 2"), ([[-1.0, -1.0 + 8.0]], "token 1/e^8")],
)
def test_extreme_sequences_are_masked(behaviour: list[list[float]], why: str) -> None:
    inp = _inputs([[-1.0, -1.0], [-1.0, -1.0]], [*behaviour, [-1.0, -1.0]], [1.0, 1.0])
    loss, stats = policy_loss(inp, configure(LossConfig, is_cap=100.0), num_tokens=4)
    loss.backward()
    assert inp.logp.grad is not None
    torch.testing.assert_close(inp.logp.grad[0], torch.zeros(2).double(), msg=why)
    torch.testing.assert_close(inp.logp.grad[1], torch.full((2,), -0.25).double())
    assert stats.means()["masked_seq_frac"] == 0.5


def test_clipping_against_the_proximal_policy() -> None:
    # r = exp(logp - prox) = e^0.5 > 1.2: for A > 0 the clipped branch is active (no gradient),
    # for A < 0 the unclipped branch is smaller, so the gradient is w * r * A.
    logp, prox = [[-0.5], [-0.5]], torch.tensor([[-1.0], [-1.0]], dtype=torch.float64)
    inp = _inputs(logp, [[-1.0], [-1.0]], [1.0, -1.0], proximal_logp=prox)
    loss, stats = policy_loss(inp, configure(LossConfig, clip_eps=0.2))
    loss.backward()
    assert inp.logp.grad is not None
    torch.testing.assert_close(inp.logp.grad, torch.tensor([[0.0], [math.exp(0.5) / 2]]).double())
    assert stats.means()["clip_frac"] == 0.5


def test_clip_higher_widens_the_upper_range() -> None:
    prox = torch.tensor([[-1.0]], dtype=torch.float64)
    inp = _inputs([[-0.8]], [[-1.0]], [1.0], proximal_logp=prox)  # r = e^0.2 = 1.22
    grad = _grad(inp, configure(LossConfig, clip_eps=0.2, clip_eps_high=0.3))
    torch.testing.assert_close(grad, torch.tensor([[-math.exp(0.2)]]).double())


def test_without_correction_behaviour_is_ignored() -> None:
    inp = _inputs([[-1.0, -1.0]], [[-3.0, -0.2]], [1.0])
    grad = _grad(inp, configure(LossConfig, correction=False))
    torch.testing.assert_close(grad, torch.full((1, 2), -0.5).double())


def test_reward_weighted_likelihood_for_traces_without_behaviour() -> None:
    inp = _inputs([[-1.0, -2.0], [-0.5, -0.5]], None, [1.0, -2.0])
    cfg = configure(LossConfig, rwl_coef=0.5, rwl_beta=2.0, rwl_max_weight=1.5)
    loss, stats = policy_loss(inp, cfg)
    loss.backward()
    w = torch.tensor([min(math.exp(0.5), 1.5), math.exp(-1.0)])  # always positive
    assert inp.logp.grad is not None
    torch.testing.assert_close(inp.logp.grad, (-0.5 * w[:, None] / 4).expand(2, 2).double())
    assert stats.means()["rwl_loss"] == pytest.approx(float(loss.detach()))
    assert stats.sums["is_tokens"] == 0


def test_kl_and_entropy_terms() -> None:
    logp = [[-1.0, -0.5]]
    ref = torch.tensor([[-1.5, -0.5]], dtype=torch.float64)
    ent = torch.tensor([[0.8, 0.4]], dtype=torch.float64, requires_grad=True)
    inp = _inputs(logp, logp, [0.0], ref_logp=ref, entropy=ent)
    loss, stats = policy_loss(inp, configure(LossConfig, kl_coef=0.1, entropy_coef=0.01))
    loss.backward()
    # d/dlogp [exp(ref - logp) - (ref - logp) - 1] = 1 - exp(ref - logp)
    expected = 0.1 * (1 - torch.exp(ref - torch.tensor(logp).double())) / 2
    assert inp.logp.grad is not None and ent.grad is not None
    torch.testing.assert_close(inp.logp.grad, expected)
    torch.testing.assert_close(ent.grad, torch.full((1, 2), -0.01 / 2).double())
    assert stats.means()["kl"] == pytest.approx((math.exp(-0.5) + 0.5 - 1) / 2)


def test_num_tokens_makes_micro_batches_add_up() -> None:
    logp = [[-1.0, -0.2], [-0.3, -0.9]]
    behaviour = [[-1.1, -0.1], [-0.4, -0.7]]
    whole = _inputs(logp, behaviour, [1.0, -1.0])
    full = _grad(whole, configure(LossConfig))
    stats = LossStats()
    for row in range(2):
        part = _inputs([logp[row]], [behaviour[row]], [[1.0, -1.0][row]])
        loss, s = policy_loss(part, configure(LossConfig), num_tokens=4)
        loss.backward()
        stats.merge(s)
        assert part.logp.grad is not None
        torch.testing.assert_close(part.logp.grad[0], full[row])
    assert stats.means()["tokens"] == 4
