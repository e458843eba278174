"""The pipeline benchmark's time-to-target ratio and its bootstrap interval over seeds."""

from __future__ import annotations

import math

from benchmarks import pipeline_measure as pm


def curve(*points: tuple[float, float]) -> list[list[float]]:
    return [[t, v] for t, v in points]


def test_ttt_ratio_uses_the_lower_median_final_as_target() -> None:
    fast = [curve((0, 0.1), (10, 0.3), (20, 0.5)), curve((0, 0.1), (20, 0.3), (30, 0.4))]
    slow = [curve((0, 0.1), (40, 0.2), (60, 0.3)), curve((0, 0.1), (60, 0.3), (80, 0.3))]
    # target 0.3 (sync's median final); async reaches it at 10 and 20, sync at 60 and 60
    assert pm.ttt_ratio({"async": fast, "sync": slow}) == 60 / 15
    never = [curve((0, 0.1), (60, 0.2))]
    assert pm.ttt_ratio({"async": never, "sync": never}) == 1.0  # target 0.2: both at 60
    assert pm.ttt_ratio({"async": [curve((0, 0.5))], "sync": slow}) == math.inf


def test_interval_brackets_the_ratio_and_is_a_point_when_seeds_agree() -> None:
    same = [curve((0, 0.1), (10, 0.3))] * 3
    slow = [curve((0, 0.1), (30, 0.3))] * 3
    assert pm.ttt_ratio_interval({"async": same, "sync": slow}) == (3.0, 3.0)
    fast = [curve((0, 0.1), (t, 0.3)) for t in (10, 20, 40)]
    lo, hi = pm.ttt_ratio_interval({"async": fast, "sync": slow}, draws=500)
    assert lo < pm.ttt_ratio({"async": fast, "sync": slow}) < hi
    assert lo >= 30 / 40 and hi <= 30 / 10


def test_the_wider_arith_pool_keeps_every_built_in_task_in_its_split() -> None:
    from services import suites

    built_in = {t.task_id: s for s in suites.SPLITS for t in suites.get("arith").tasks(s)}
    wide = {t.task_id: s for s in suites.SPLITS for t in pm.arith_tasks(s, 1000)}
    assert len(wide) == 10_000 and all(k.startswith(f"{pm.WIDE}/") for k in wide)
    assert len(built_in) == 1000
    assert all(wide[k.replace("arith", pm.WIDE, 1)] == split for k, split in built_in.items())
    assert {t.suite for t in pm.arith_tasks("train", 1000)} == {pm.WIDE}


def test_held_out_tasks_are_the_built_in_ones_or_spread_over_the_wider_split() -> None:
    from services import suites

    assert [t.task_id for t in pm.heldout_tasks(50)] == [
        t.task_id for t in suites.get("arith").tasks("heldout")[:50]
    ]
    spread = pm.heldout_tasks(193, 1000)
    held = {t.task_id for t in pm.arith_tasks("heldout", 1000)}
    assert len({t.task_id for t in spread}) == 193 and {t.task_id for t in spread} <= held
    firsts = sorted(int(t.task_id.split("/")[1].split("+")[0]) for t in spread)
    assert firsts[0] < 20 and firsts[-1] > 950  # spread over the universe, not its start
    assert len(pm.heldout_tasks(5000, 1000)) == len(held)
