"""learner/signal.py: which samples can move the policy, checked against the loss itself."""

from __future__ import annotations

import pytest
import torch

from learner.loss import LossConfig, LossInputs, policy_loss
from learner.signal import NO_SIGNAL, no_signal_reason


@pytest.mark.parametrize(
    ("advantage", "has_behaviour", "kl", "entropy", "skipped"),
    [
        (0.0, True, 0.0, 0.0, True),
        (1e-12, True, 0.0, 0.0, True),
        (-0.3, True, 0.0, 0.0, False),
        (0.0, False, 0.0, 0.0, False),  # production trace: exp(A / beta) > 0 weighs it
        (0.0, True, 0.1, 0.0, False),  # the KL term has a gradient whatever A
        (0.0, True, 0.0, 0.01, False),  # so has the entropy bonus
    ],
)
def test_no_signal_reason(
    advantage: float, has_behaviour: bool, kl: float, entropy: float, skipped: bool
) -> None:
    got = no_signal_reason(advantage, has_behaviour, kl_coef=kl, entropy_coef=entropy)
    assert got == (NO_SIGNAL if skipped else None)


def _cfg() -> LossConfig:
    from learner.config import configure

    return configure(LossConfig)


def test_what_is_skipped_has_exactly_zero_gradient() -> None:
    """Rows of advantage 0 with behaviour logprobs add nothing to the loss's gradient: the
    gradient with them equals the gradient without them times the token-count ratio."""
    torch.manual_seed(0)
    logits = torch.randn(4, 5, requires_grad=True)
    adv = torch.tensor([1.0, 0.0, -0.5, 0.0])
    behaviour = logits.detach() + 0.05 * torch.randn(4, 5)

    def grad(rows: list[int]) -> torch.Tensor:
        logits.grad = None
        inp = LossInputs(logp=logits[rows], mask=torch.ones(len(rows), 5),
                         advantages=adv[rows], behaviour_logp=behaviour[rows],
                         has_behaviour=torch.ones(len(rows), dtype=torch.bool))  # fmt: skip
        loss, _ = policy_loss(inp, _cfg())
        loss.backward()
        assert logits.grad is not None
        return logits.grad.clone()

    skipped = [i for i in range(4) if no_signal_reason(float(adv[i]), True, kl_coef=0.0,
                                                      entropy_coef=0.0)]  # fmt: skip
    assert skipped == [1, 3]
    full, kept = grad([0, 1, 2, 3]), grad([0, 2])
    assert torch.allclose(full * 4 / 2, kept, atol=1e-7)
    assert torch.count_nonzero(full[skipped]) == 0
