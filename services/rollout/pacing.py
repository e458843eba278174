"""Admission control of the generators (DESIGN.md section 7, refined in CHANGELOG), pure.

One count on both sides, of the same things: trajectories the generators produced for
the learner (each generator counts the whole groups it published and acknowledged, and
announces its count on `progress`) and generated samples the learner has settled
(trained, dropped as stale or invalid, masked: it announces the count on `progress` on
its own cadence, not only with weights)::

    outstanding = own produced + own in flight + others' produced - learner's consumed
    window      = (learner.max_lag + 1) x batch          (batch: trajectories per step)
    start a group of G  iff  outstanding + G <= window  or  outstanding <= 0

Dead letters, replays and production traces are on neither side, so the window does not
drift; the learner's count moves whenever it settles samples (stale ones too), so it does
not stall: there is no liveness escape. Samples sampled further ahead than the window
would reach the learner more than max_lag versions late and be dropped as stale. The
second clause keeps a window smaller than one group from deadlocking (then outstanding
stays within one group). One generator alone never exceeds the window; several check the
others' counts as last announced, so they may overshoot by at most (generators - 1) x G.
"""

from __future__ import annotations

from dataclasses import dataclass


def batch_samples(batch_tokens: int, mean_tokens: float | None, override: int | None) -> int:
    """Trajectories per learner batch: the configured number, else the learner's token
    budget over the mean trajectory length (prompt + completion tokens) seen so far."""
    if override is not None:
        return max(1, override)
    if not mean_tokens or mean_tokens <= 0:
        return 1
    return max(1, int(batch_tokens // mean_tokens))


def window(max_lag: int, batch: int) -> int:
    """Trajectories that may be outstanding (produced, not yet settled by the learner)."""
    return (max_lag + 1) * max(1, batch)


def outstanding(own: int, in_flight: int, others: int, consumed: int) -> int:
    """Trajectories produced (or being sampled) for the learner and not yet settled."""
    return own + in_flight + others - consumed


def may_start(group_size: int, outstanding_now: int, window_size: int) -> bool:
    """Whether a group of `group_size` may be sampled now."""
    return outstanding_now <= 0 or outstanding_now + group_size <= window_size


@dataclass
class RunningMean:
    """Mean of the most recent values, with exponential forgetting (weight `decay` per
    value), so the pacing estimate follows a changing mix of tasks (slowly: about the last
    200 trajectories, so a run of long samples does not shrink the window at once)."""

    decay: float = 0.995
    _sum: float = 0.0
    _weight: float = 0.0

    def add(self, value: float) -> None:
        self._sum = self._sum * self.decay + value
        self._weight = self._weight * self.decay + 1.0

    @property
    def value(self) -> float | None:
        return self._sum / self._weight if self._weight else None
