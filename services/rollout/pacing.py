"""Admission control of the generators (DESIGN.md section 7), pure.

A generator may start a group only while the trajectories published (by every producer,
read from the end offsets of `trajectories`) stay within a window of what the learner has
consumed (its last WeightUpdate's samples_consumed)::

    window = (learner.max_lag + 1) x batch         (batch: trajectories per learner step)
    start a group of G  iff  outstanding + G <= window  or  outstanding <= 0

Samples sampled further ahead than that would reach the learner more than max_lag
versions late and be dropped as stale: compute spent for nothing. The second clause keeps
a window smaller than one group from deadlocking. Several generators check the same
global numbers; they may overshoot by at most (generators - 1) x G between two checks.

Liveness: the learner announces samples_consumed only when it publishes weights, that is
after a training step. When every sample in flight arrives stale (slow verifications),
the learner drops them all without a step, the announced count stops, and the window
would stay full forever. So when the announced count has not moved for
`generator.pace_stall_s` (longer than the learner's batch wait: it would have trained on
any fresh sample by then), one group may start anyway; the bound is exceeded by at most
one group per stall period, and a learner that is down gets only that trickle.
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
    """Trajectories that may be outstanding (published, not yet consumed by the learner)."""
    return (max_lag + 1) * max(1, batch)


def may_start(
    group_size: int, published: int, consumed: int, window_size: int, stalled: bool = False
) -> bool:
    """Whether a group of `group_size` may be sampled now. `stalled`: the learner's
    progress has not moved for generator.pace_stall_s (see the module docstring)."""
    outstanding = published - consumed
    return stalled or outstanding <= 0 or outstanding + group_size <= window_size


def stalled(consumed_since_s: float, stall_s: float) -> bool:
    """Whether the learner's announced progress has been still for longer than `stall_s`
    (0 disables the escape)."""
    return stall_s > 0 and consumed_since_s > stall_s


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
