"""Which samples can move the policy (pure).

The policy-gradient term of a sample with behaviour logprobs is ``w * A * grad log pi``
(learner/loss.py): with advantage ``A = 0`` its gradient is exactly zero. Every member of
a group whose rewards were all equal has ``A = 0`` (streams/members.group_advantages), and
so has a member scored exactly the group's mean. Trained on, such samples only fill the
token budget of a batch and dilute the loss's per-token mean; the learner settles them
without training (ledger: dropped, `no signal`) when `learner.skip_no_signal` is on, so a
batch holds `batch_tokens` of samples that teach (as DAPO's dynamic sampling does).

Not skipped: samples without behaviour logprobs (production traces: the reward-weighted
likelihood term weighs them by exp(A / beta) > 0), and every sample while a KL or an
entropy term is on (both give a gradient whatever the advantage).
"""

from __future__ import annotations

NO_SIGNAL = "no signal: advantage 0 (the group's rewards were all equal)"
"""The ledger reason of a skipped sample."""
EPS = 1e-9
"""Advantages within this of 0 count as 0 (group_advantages returns 0.0 exactly)."""


def no_signal_reason(
    advantage: float, has_behaviour: bool, *, kl_coef: float, entropy_coef: float
) -> str | None:
    """The ledger reason when training on the sample would add nothing to the gradient,
    else None."""
    if not has_behaviour or kl_coef > 0 or entropy_coef > 0:
        return None
    return NO_SIGNAL if abs(advantage) <= EPS else None
