"""`feeder.frontier` (services/rollout/frontier.py): the shared shift fitted to recent
groups, the chance it gives each task, and the sampler taking tasks by it."""

from __future__ import annotations

import math
from collections import Counter

import pytest
from pydantic import ValidationError

from schemas.rollout import Task
from schemas.sandbox import VerifierSpec
from services.rollout.config import FeederSettings
from services.rollout.frontier import Frontier, fit_shift, informative, logit, sigmoid
from services.rollout.sampler import SuiteSampler
from services.suites.calibration import Calibration, rates


def task(task_id: str, family: str | None = None) -> Task:
    spec = VerifierSpec(name="exact", answer="1", needs_sandbox=False)
    meta = {"family": family} if family else {}
    return Task(task_id=task_id, suite="s", prompt="p", verifier=spec, group_size=8,
                metadata=meta)  # fmt: skip


def test_a_group_teaches_most_often_at_an_even_pass_rate() -> None:
    assert informative(0.5, 8) == pytest.approx(1 - 2 / 256)
    assert informative(0.0, 8) == 0.0 and informative(1.0, 8) == 0.0
    assert informative(0.9, 8) == pytest.approx(1 - 0.9**8 - 0.1**8)
    assert informative(0.3, 8) > informative(0.9, 8)
    assert sigmoid(logit(0.2)) == pytest.approx(0.2) and sigmoid(-800.0) == 0.0


@pytest.mark.parametrize("shift", [-1.5, 0.0, 0.7, 2.0])
def test_fit_shift_recovers_the_shift_the_groups_were_drawn_with(shift: float) -> None:
    priors = [logit(p) for p in (0.1, 0.25, 0.4, 0.5, 0.6, 0.75, 0.9)] * 40
    groups = [(lg, 8 * sigmoid(lg + shift), 8) for lg in priors]  # expected passes
    assert fit_shift(groups) == pytest.approx(shift, abs=0.01)  # the weak prior barely pulls


def test_fit_shift_stays_finite_when_every_group_passes() -> None:
    d = fit_shift([(logit(0.5), 8.0, 8)] * 50)
    assert 3.0 < d < 30.0 and math.isfinite(d)
    assert fit_shift([]) == 0.0


def test_frontier_moves_chances_from_solved_tasks_to_hard_ones() -> None:
    easy, hard, new = task("easy"), task("hard"), task("new")
    f = Frontier.from_rates({"easy": 0.9, "hard": 0.1, "never": None}, floor=0.2)
    assert f.chance(easy) == pytest.approx(informative(0.9, 8) / informative(0.5, 8))
    assert f.chance(hard) == pytest.approx(f.chance(easy))  # symmetric before training
    assert f.chance(new) == 1.0 and "never" not in f.logits  # unmeasured: always taken
    for _ in range(64):  # the policy got better: tasks measured at 0.5 now pass 7 of 8
        f.observe("mid", [1.0] * 7 + [0.0])
    assert f.shift == 0.0  # not a measured task: ignored
    f.logits["mid"] = 0.0
    for _ in range(64):
        f.observe("mid", [1.0] * 7 + [0.0])
    assert f.shift == pytest.approx(logit(7 / 8), abs=0.05)
    assert f.chance(easy) == 0.2  # floor: nearly every group of it would all pass
    assert f.chance(hard) > 0.99  # now near an even pass rate
    f.observe("mid", [2.0, -1.0])  # rewards outside [0, 1] count as a pass and a fail
    assert f.recent[-1] == (0.0, 1.0, 2)


def test_sampler_takes_tasks_by_the_smaller_of_its_two_chances() -> None:
    s = SuiteSampler({"s": 1.0}, seed=3)
    s.add_all([task(f"easy{i}") for i in range(10)] + [task(f"hard{i}") for i in range(10)])
    s.prior = lambda t: 0.1 if t.task_id.startswith("easy") else 1.0
    picks = Counter(t.task_id[:4] for t in (s.next() for _ in range(3000)) if t)
    assert picks["hard"] > 5 * picks["easy"] > 0
    s.prior = lambda t: 1.0
    s.task_multipliers = {f"hard{i}": 0.1 for i in range(10)}
    picks = Counter(t.task_id[:4] for t in (s.next() for _ in range(3000)) if t)
    assert picks["easy"] > 5 * picks["hard"] > 0


def test_rates_pool_a_family_for_its_unmeasured_members() -> None:
    cal = Calibration(tasks={"a1": (2, 8), "a2": (6, 8), "b": (1, 4)})
    got = rates([task("a1", "a"), task("a2", "a"), task("a3", "a"), task("b"), task("c")], cal)
    assert got == {"a1": 0.25, "a2": 0.75, "a3": 0.5, "b": 0.25, "c": None}
    f = Frontier.of([task("a1", "a"), task("a3", "a"), task("c")], cal, floor=0.2)
    assert set(f.logits) == {"a1", "a3"}  # a3 from a1's counts; c never measured


def test_frontier_needs_a_calibration() -> None:
    with pytest.raises(ValidationError, match=r"frontier needs feeder\.calibration"):
        FeederSettings(frontier=True)
    assert FeederSettings(frontier=True, calibration="smollm2-code").frontier
