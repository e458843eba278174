"""`feeder.frontier`: tasks sampled by the chance that their next group teaches. Pure.

A group teaches only when its rewards differ. At the policy's pass rate ``q`` on a task,
a group of ``G`` samples has that chance ``1 - q^G - (1 - q)^G``, highest at ``q = 0.5``.
The calibration (services/suites/calibration.py) measured every task's pass rate under the
initial policy; training then moves the rates, and a fast pipeline spends more and more of
its groups on tasks it now always solves (or still never does). Each task is drawn about
once or twice in a run over a large pool, too seldom for its own history to say where it
stands (`sampler.task_multiplier`), so the rates are taken to move together: on the logit
scale every task's rate moves by one *shift*, fitted by maximum likelihood to the rewards
of the recent groups (`fit_shift`). When its turn comes a task is then taken with chance
``informative(q) / informative(0.5)``, never below a floor; tasks the calibration never
measured are always taken.

Rewards are read as pass fractions: clipped to [0, 1], a group's rewards add up to its
passes (partial credit counts in proportion). The suite is still drawn by weight first:
this changes which tasks of a suite are taken, not the mix of suites.

Measured (README, Benchmarks): where per-task outcomes are nearly all-or-nothing and the
calibration predicts them weakly (the pipeline benchmark's wide `arith` pool), one shared
shift moves few tasks; hence off by default.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

from schemas.rollout import Task

if TYPE_CHECKING:
    from services.suites.calibration import Calibration

WINDOW = 256
"""Recent groups the shift is fitted to."""
REFIT_EVERY = 8
"""Groups between two fits."""
PRIOR_SD = 3.0
"""Standard deviation (logits) of a weak normal prior on the shift around 0, so that a
window of groups that all pass (or all fail) still gives a finite shift."""
EDGE = 0.02
"""Calibrated rates are clipped to [EDGE, 1 - EDGE] (a task measured 16/16 is not certain)."""


def logit(p: float) -> float:
    return math.log(p / (1.0 - p))


def sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x)) if x >= 0 else math.exp(x) / (1.0 + math.exp(x))


def informative(q: float, group_size: int) -> float:
    """The chance that a group of `group_size` samples at pass rate `q` does not all pass
    and does not all fail."""
    return 1.0 - q**group_size - (1.0 - q) ** group_size


def fit_shift(groups: Iterable[tuple[float, float, int]], start: float = 0.0) -> float:
    """The shift ``d`` maximising the likelihood of `groups` (prior logit ``l``, passes
    ``k``, samples ``n``), each sample passing with probability ``sigmoid(l + d)``, under a
    normal(0, PRIOR_SD) prior on ``d``. Newton's method (the log-likelihood is concave)."""
    obs = list(groups)
    d, precision = start, 1.0 / PRIOR_SD**2
    for _ in range(50):
        grad, curv = -d * precision, precision
        for lg, k, n in obs:
            q = sigmoid(lg + d)
            grad += k - n * q
            curv += n * q * (1.0 - q)
        step = max(-2.0, min(2.0, grad / curv))
        d += step
        if abs(step) < 1e-9:
            break
    return d


class Frontier:
    """The calibrated logit of each measured task, the recent groups, and the fitted shift."""

    def __init__(self, logits: Mapping[str, float], floor: float, window: int = WINDOW):
        self.logits = dict(logits)
        self.floor = floor
        self.shift = 0.0
        self.recent: deque[tuple[float, float, int]] = deque(maxlen=window)
        self.observed = 0
        """Groups of measured tasks seen so far."""

    @classmethod
    def from_rates(cls, rates: Mapping[str, float | None], floor: float) -> Frontier:
        """From measured pass rates (task id -> rate; None: never measured, left out)."""
        measured = {k: min(1.0 - EDGE, max(EDGE, p)) for k, p in rates.items() if p is not None}
        return cls({k: logit(p) for k, p in measured.items()}, floor)

    @classmethod
    def of(cls, tasks: Iterable[Task], cal: Calibration, floor: float) -> Frontier:
        """Over `tasks`, from their rates in `cal` (family counts pooled)."""
        from services.suites.calibration import rates

        return cls.from_rates(rates(tasks, cal), floor)

    def chance(self, task: Task) -> float:
        """How likely `task` is taken when its turn comes (1 for an unmeasured task)."""
        lg = self.logits.get(task.task_id)
        if lg is None:
            return 1.0
        g = max(2, task.group_size)
        share = informative(sigmoid(lg + self.shift), g) / informative(0.5, g)
        return max(self.floor, min(1.0, share))

    def observe(self, task_id: str, rewards: Sequence[float]) -> None:
        """A completed group's rewards; every REFIT_EVERY groups the shift is fitted again."""
        lg = self.logits.get(task_id)
        if lg is None or not rewards:
            return
        passes = sum(min(1.0, max(0.0, r)) for r in rewards)
        self.recent.append((lg, passes, len(rewards)))
        self.observed += 1
        if self.observed % REFIT_EVERY == 0:
            self.shift = fit_shift(self.recent, start=self.shift)
