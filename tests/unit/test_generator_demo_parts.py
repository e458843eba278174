"""The demo's pure parts: run statistics, the settings it hands its services, the report."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from services import suites
from services.demo import child_env, evaluated, run_settings
from services.rollout.evaluate import EvalResult
from services.rollout.report import Report, _binned, markdown, write
from services.rollout.stats import RunStats
from services.settings import load


def test_run_stats_window_rates_reward_and_staleness() -> None:
    s = RunStats(window_s=10)
    s.on_weights(version=3, samples_consumed=20)
    for i in range(30):
        s.on_trajectory(now=100 + i * 0.1)
    s.on_reward(101, "arith", 1.0, version=3, masked=False, passed=True)
    s.on_reward(102, "arith", 0.0, version=1, masked=False, passed=False)
    s.on_reward(102, "pyfunc", 0.5, version=2, masked=False, passed=False)
    s.on_reward(103, "pyfunc", 0.0, version=2, masked=True, passed=False)
    row = s.row(now=105, t=5)
    assert row.trajectories == 30 and row.scored == 4
    assert row.traj_per_s == pytest.approx(30 / 5)
    assert row.reward == pytest.approx(0.5)  # masked rewards are left out
    assert row.staleness == pytest.approx((0 + 2 + 1) / 3)
    assert row.suite_reward == {"arith": 0.5, "pyfunc": 0.5}
    assert row.outstanding == 10
    assert s.per_version == {3: [1.0, 1], 1: [0.0, 1], 2: [0.5, 1]}
    later = s.row(now=200, t=100)  # everything left the window
    assert later.reward is None and later.traj_per_s == 0


def test_groups_that_teach_nothing_are_counted_by_why() -> None:
    s = RunStats()
    groups = {  # group id -> (reward, passed, masked) of its 3 members
        "mixed": [(1.0, True, False), (0.0, False, False), (1.0, True, False)],
        "failed": [(0.0, False, False), (0.0, False, True), (0.0, False, False)],
        "solved": [(1.0, True, False)] * 3,
        "partial": [(0.5, False, False)] * 3,  # equal partial credit, none passed: failed
        "masked": [(0.0, False, True)] * 3,
        "open": [(1.0, True, False)] * 2,  # one member still unscored
    }
    for gid, members in groups.items():
        for reward, passed, masked in members:
            s.on_reward(1.0, "a", reward, 0, masked, passed, group=(gid, 3))
    row = s.row(now=2.0, t=2.0)
    assert row.groups == 5 and row.flat_groups == pytest.approx(4 / 5)
    assert row.all_failed == pytest.approx(2 / 5) and row.all_passed == pytest.approx(1 / 5)
    assert RunStats().row(now=0, t=1).all_failed is None
    assert "0.80 of 5 (all failed 0.40, all passed 0.20)" in markdown(
        Report("d", 1.0, [row], {}, [], [], {}, 0), None
    )


def test_ledger_counts_each_trajectory_once_with_reasons() -> None:
    s = RunStats()
    s.on_ledger("a", "trained", "")
    s.on_ledger("a", "trained", "")  # redelivered entry
    s.on_ledger("b", "dropped", "stale: lag 5 > max_lag 4")
    s.on_ledger("c", "masked", "sandbox_error: pool broken")
    row = s.row(now=0, t=1)
    assert (row.trained, row.dropped, row.masked) == (1, 1, 1)
    assert s.drop_reasons == {"dropped: stale": 1, "masked: sandbox_error": 1}


def test_run_settings_fresh_prefix_and_overrides_only_where_unset() -> None:
    base = load(["learner.batch_tokens=999", "demo.prefix=demo-x", "demo.policy=tiny"])
    s = run_settings(base)
    assert s.topics.prefix == "demo-x"
    assert s.learner.batch_tokens == 999  # set explicitly: the override stays out
    overrides = base.demo.overrides_for(s.learner.model)
    assert s.learner.max_seq_len == int(overrides["learner.max_seq_len"])
    assert run_settings(load()).topics.prefix.startswith("demo-")
    with pytest.raises(ValueError, match="unknown setting"):
        run_settings(load(["demo.overrides=learner.nope=1"]))


def test_the_demo_policy_picks_the_model_and_its_defaults() -> None:
    from services.config import DEMO_OVERRIDES, PRETRAINED_DEMO_OVERRIDES

    s = run_settings(load())
    assert s.learner.model == "smollm2" and s.feeder.suites == {"code": 1.0}
    assert s.feeder.adapt and s.learner.lr == float(PRETRAINED_DEMO_OVERRIDES["learner.lr"])
    assert s.demo.eval_extra == {"humaneval": 40} and s.feeder.max_turns == 1
    assert s.demo.eval_tasks == 0  # every held-out code task
    tiny = run_settings(load(["demo.policy=tiny"]))
    assert tiny.learner.model == "tiny" and tiny.feeder.suites == {"arith": 0.85, "pyfunc": 0.15}
    assert tiny.learner.batch_tokens == int(DEMO_OVERRIDES["learner.batch_tokens"])
    assert run_settings(load(["learner.model=tiny"])).learner.model == "tiny"  # explicit wins
    assert run_settings(load(["demo.two_turn=true"])).feeder.max_turns == 2


def test_child_env_reproduces_the_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    s = run_settings(load(["demo.prefix=demo-y", "feeder.suites=arith=1"]))
    env = child_env(s)
    for key, value in env.items():
        if key.startswith("ROLLSTREAM__"):
            monkeypatch.setenv(key, value)
    again = load()
    assert again.topics.prefix == "demo-y"
    assert again.learner == s.learner and again.feeder == s.feeder
    assert env["OMP_NUM_THREADS"] == "1"


def test_report_files(tmp_path: Path) -> None:
    s = RunStats()
    rows = []
    for i in range(5):
        s.on_trajectory(float(i))
        s.on_reward(float(i), "arith", i / 5, version=i, masked=False, passed=i > 2)
        s.on_weights(i, i)
        rows.append(s.row(now=float(i), t=float(i * 30)))
    before = [EvalResult("arith", 10, 0.1, 0.1, 0.1)]
    after = [EvalResult("arith", 10, 0.5, 0.4, 0.4)]
    rep = Report("demo-z", 2.0, rows, s.per_version, before, after, {"published": 5}, 4)
    assert rep.heldout_table() == [("arith", 0.1, 0.5, 0.1, 0.4)]
    plot_path, md = write(rep, tmp_path)
    assert plot_path is not None and plot_path.stat().st_size > 10_000
    text = md.read_text()
    assert "| arith | 0.100 | 0.500 | 0.100 | 0.400 |" in text and "plot.png" in text
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["after"][0]["greedy_pass"] == 0.5 and summary["final_version"] == 4
    assert "demo-z" in markdown(rep, None)


def test_binned_rewards_per_version() -> None:
    xs, ys = _binned({0: [1.0, 2], 1: [3.0, 2], 2: [0.0, 1]}, bins=100)
    assert xs == [0, 1, 2] and ys == [0.5, 1.5, 0.0]
    assert _binned({}) == ([], [])


def test_chaos_runs_the_tiny_policy_unless_told_otherwise() -> None:
    from services.chaos_stack import chaos_settings

    s = chaos_settings(load())
    assert s.learner.model == "tiny" and s.topics.prefix.startswith("chaos-")
    assert s.feeder.suites == {"arith": 0.85, "pyfunc": 0.15}
    assert chaos_settings(load(["demo.policy=smollm2"])).learner.model == "smollm2"


def test_report_says_n_a_for_a_sampled_pass_not_measured() -> None:
    nan = float("nan")
    before = [EvalResult("code", 10, 0.2, nan, nan)]
    after = [EvalResult("code", 10, 0.3, nan, nan)]
    rep = Report("demo-n", 1.0, [], {}, before, after, {}, 1)
    text = markdown(rep, None)
    assert "| code | 0.200 | 0.300 | n/a | n/a |" in text and "nan" not in text


def test_live_line_counts_what_the_learner_announced_consumed() -> None:
    from services.rollout.live import _line

    s = RunStats(window_s=10)
    s.on_weights(version=4, samples_consumed=96)
    for i in range(120):
        s.on_trajectory(now=100 + i * 0.01)
    line = _line(s.row(now=102, t=2))  # no ledger entry yet: the outbox flushes later
    assert "v4" in line and "consumed 96 outstanding 24" in line and "trained" not in line


def test_the_demo_evaluates_the_first_n_held_out_tasks_or_all() -> None:
    held = suites.get("code").tasks("heldout")
    assert evaluated(held, 5) == held[:5]
    assert evaluated(held, 0) == held and len(held) >= 300
    assert evaluated(held, 10_000) == held
