"""Which task comes next: suites sampled by weight, tasks cycled in a shuffled order; and
the optional adaptation of suite weights from observed group outcomes. Pure."""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from schemas.rollout import Task


class SuiteSampler:
    """Pick a suite with probability proportional to weight x multiplier (among suites with
    admitted tasks), then the suite's next task: every task once per epoch, reshuffled each
    epoch. Deterministic for a seed and an order of `add` calls."""

    def __init__(self, weights: dict[str, float], seed: int = 0, default_weight: float = 1.0):
        bad = {k: w for k, w in weights.items() if w < 0}
        if bad:
            raise ValueError(f"suite weights must be >= 0: {bad}")
        self.weights = dict(weights)
        self.default_weight = default_weight
        self.multipliers: dict[str, float] = {}
        self.task_multipliers: dict[str, float] = {}
        """task_id -> chance that the task is taken when its turn comes (default 1; see
        `task_multiplier`): tasks whose groups all pass or all fail are skipped more."""
        self.prior: Callable[[Task], float] | None = None
        """A second chance per task, from a model of where the policy stands
        (`feeder.frontier`, services/rollout/frontier.py); a task is taken with the smaller
        of the two."""
        self.paused: set[str] = set()
        """Suites not sampled for now (flow control), whatever their weight."""
        self._rng = random.Random(seed)
        self._pools: dict[str, list[Task]] = {}
        self._order: dict[str, deque[Task]] = {}

    def add(self, task: Task) -> None:
        """Admit a task: it joins its suite's pool from the suite's next epoch on."""
        self._pools.setdefault(task.suite, []).append(task)
        self._order.setdefault(task.suite, deque())

    def add_all(self, tasks: Iterable[Task]) -> None:
        for t in tasks:
            self.add(t)

    def weight(self, suite: str) -> float:
        base = self.weights.get(suite, self.default_weight)
        return base * self.multipliers.get(suite, 1.0)

    def active(self) -> dict[str, float]:
        """Suites that can be sampled now, with their effective weights."""
        return {
            s: self.weight(s)
            for s, pool in self._pools.items()
            if pool and self.weight(s) and s not in self.paused
        }

    def next(self) -> Task | None:
        """The next task, or None while no suite with a positive weight has a task."""
        active = self.active()
        if not active:
            return None
        names = sorted(active)
        suite = self._rng.choices(names, weights=[active[n] for n in names])[0]
        order = self._order[suite]
        for _ in range(len(self._pools[suite])):
            if not order:
                epoch = list(self._pools[suite])
                self._rng.shuffle(epoch)
                order.extend(epoch)
            task = order.popleft()
            chance = self.task_multipliers.get(task.task_id, 1.0)
            if self.prior is not None:
                chance = min(chance, self.prior(task))
            if chance >= 1.0 or self._rng.random() < chance:
                return task
        return task  # every task of the suite was skipped once: take the last one

    def size(self, suite: str) -> int:
        return len(self._pools.get(suite, ()))


@dataclass
class GroupTally:
    """Rewards of the groups being scored, until each group is complete."""

    open: dict[str, tuple[str, int, list[float]]] = field(default_factory=dict)
    """group_id -> (suite, group size, rewards so far)."""
    max_open: int = 10_000

    def add(self, group_id: str, suite: str, group_size: int, reward: float) -> list[float] | None:
        """Record one reward; when the group is complete, return its rewards, else None."""
        entry = self.open.setdefault(group_id, (suite, group_size, []))
        entry[2].append(reward)
        if len(entry[2]) < entry[1]:
            if len(self.open) > self.max_open:  # groups that never complete (masked members)
                self.open.pop(next(iter(self.open)))
            return None
        del self.open[group_id]
        return entry[2]


def informative(rewards: list[float]) -> bool:
    """Whether a complete group's rewards differ, so its advantages are not all zero."""
    return bool(rewards) and max(rewards) - min(rewards) > 1e-9


def flat_kind(rewards: list[float], passed: list[bool]) -> str | None:
    """Why a complete group teaches nothing: None when its rewards differ (it teaches),
    else `failed` (no member passed, whatever partial credit they share: the task is beyond
    the policy for now), `passed` (every member passed: solved) or `equal` (some passed,
    some not, under the same reward)."""
    if informative(rewards) or not rewards:
        return None
    if not any(passed):
        return "failed"
    return "passed" if all(passed) else "equal"


def group_flat_kind(members: list[tuple[float | None, bool]]) -> str | None:
    """`flat_kind` of a complete group's (reward, passed) members, the masked ones (reward
    None) left out; a group with none left teaches nothing either (`equal`)."""
    live = [(r, ok) for r, ok in members if r is not None]
    return flat_kind([r for r, _ in live], [ok for _, ok in live]) if live else "equal"


def task_multiplier(current: float, informative: bool, floor: float) -> float:
    """A task's next sampling chance after one of its groups completed: halved by a group
    whose rewards are all equal (all pass or all fail: no learning signal), never below
    `floor`; back to 1 after an informative group."""
    return 1.0 if informative else max(floor, current * 0.5)


def observe_group(
    sampler: SuiteSampler,
    history: dict[str, deque[bool]],
    group: tuple[str, str, bool],
    floor: float,
    suites: bool = True,
) -> None:
    """`feeder.adapt`'s update after one completed group (task id, suite, informative):
    the task's sampling chance (`task_multiplier`); with `suites` also its suite's recent
    outcomes (the last 50, in `history`) and every suite's multiplier (`adapt_multipliers`)."""
    task_id, suite, informative = group
    old = sampler.task_multipliers.get(task_id, 1.0)
    sampler.task_multipliers[task_id] = task_multiplier(old, informative, floor)
    if suites:
        history.setdefault(suite, deque(maxlen=50)).append(informative)
        sampler.multipliers = adapt_multipliers(history, floor)


def adapt_multipliers(
    history: dict[str, deque[bool]], floor: float, prior: float = 1.0
) -> dict[str, float]:
    """Weight multiplier per suite: the share of its recent groups that were informative
    (smoothed by `prior` pseudo-counts on each side), never below `floor`. Suites whose
    groups all pass or all fail teach nothing and are sampled less."""
    out = {}
    for suite, outcomes in history.items():
        share = (sum(outcomes) + prior) / (len(outcomes) + 2 * prior)
        out[suite] = max(floor, min(1.0, share))
    return out
