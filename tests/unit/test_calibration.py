"""Per-task pass-rate calibration (services/suites/calibration.py) and the feeder's use of it."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from schemas import codec
from schemas.rollout import ScoredTrajectory, Task, Trajectory
from schemas.sandbox import Outcome, VerifierSpec
from services import logfiles
from services.suites import calibration as cb

SPEC = VerifierSpec(name="python_tests", tests="from solution import f\n")


def task(task_id: str, family: str = "") -> Task:
    meta = {"family": family} if family else {}
    return Task(task_id=task_id, suite="code", prompt="p", verifier=SPEC, group_size=8,
                metadata=meta)  # fmt: skip


def scored(task_id: str, outcome: str, masked: bool = False) -> ScoredTrajectory:
    traj = Trajectory(task_id=task_id, group_id="g", group_size=8, verifier=SPEC)
    why = "sandbox_error after 3 attempts" if masked else ""
    return ScoredTrajectory(trajectory=traj, reward=0.0, outcome=Outcome(outcome), masked=masked,
                            mask_reason=why)  # fmt: skip


def test_scored_records_count_passes_and_leave_masked_ones_out() -> None:
    cal = cb.Calibration()
    recs = [scored("a", "passed"), scored("a", "failed"), scored("a", "compile_error"),
            scored("b", "passed", masked=True), scored("c", "passed").trajectory]  # fmt: skip
    assert cb.from_scored(recs, cal) == 3
    assert cal.tasks == {"a": (1, 3)}


def test_eval_figures_count_samples_and_the_greedy_completion() -> None:
    cal = cb.Calibration()
    fig = {"samples": 3, "sampled_passed": {"a": 2, "b": 0}, "greedy_passed": ["b"]}
    assert cb.from_eval(fig, cal) == 2
    assert cal.tasks == {"a": (2, 4), "b": (1, 4)}
    assert cal.greedy == {"a": False, "b": True}
    with pytest.raises(ValueError, match="per-task results"):
        cb.from_eval({"samples": 0, "greedy_passed": ["a"]}, cal)


def test_a_greedy_only_figure_records_greedy_outcomes_and_no_counts(tmp_path: Path) -> None:
    cal = cb.Calibration(tasks={"a": (1, 4)}, greedy={"c": True})
    fig = {"samples": 0, "sampled_passed": {}, "greedy_passed": ["b"], "task_ids": ["a", "b"]}
    path = tmp_path / "greedy.json"
    path.write_text(json.dumps(fig))
    assert cb.from_file(path, cal) == 2
    assert cal.tasks == {"a": (1, 4)} and cal.greedy == {"a": False, "b": True, "c": True}
    path.write_text(json.dumps(cal.to_json()))
    assert cb.load(path) == cal
    older = cb.Calibration(tasks={"d": (0, 2)}, greedy={"a": True, "d": False})
    assert cb.merge(older, cal) == 1
    assert cal.greedy == {"a": False, "b": True, "c": True, "d": False}  # newer outcome kept
    path.write_text(json.dumps({"tasks": {}, "greedy": {"a": 1}}))
    with pytest.raises(ValueError, match="expected true or false"):
        cb.load(path)


def test_skip_greedy_solved_leaves_out_what_greedy_decoding_passes() -> None:
    cal = cb.Calibration(greedy={"solved": True, "failed": False})
    kept, left = cb.skip_greedy_solved([task("solved"), task("failed"), task("new")], cal)
    assert [t.task_id for t in kept] == ["failed", "new"]
    assert [t.task_id for t in left] == ["solved"]


def test_the_feeder_skips_greedy_solved_tasks_only_when_asked(tmp_path: Path) -> None:
    from services.rollout.config import FeederSettings
    from services.rollout.feeder import Feeder
    from services.settings import Settings
    from services.suites import get

    train = [t.task_id for t in get("code").tasks("train")]
    path = tmp_path / "cal.json"
    path.write_text(json.dumps({"tasks": {train[0]: [3, 8], train[1]: [3, 8]},
                                "greedy": {train[0]: True, train[1]: False}}))  # fmt: skip
    base = Settings()

    def fed(skip: bool) -> set[str]:
        cfg = base.feeder.model_copy(update={"suites": {"code": 1.0}, "calibration": str(path),
                                             "skip_greedy_solved": skip})  # fmt: skip
        feeder = Feeder(base.model_copy(update={"feeder": cfg}))
        return {c.task.task_id for c in feeder.candidates() if c.task is not None}

    assert fed(False) == set(train)
    assert fed(True) == set(train) - {train[0]}
    with pytest.raises(ValueError, match="needs feeder"):
        FeederSettings(skip_greedy_solved=True)


def test_select_keeps_the_band_unmeasured_tasks_and_pools_families() -> None:
    cal = cb.Calibration(tasks={"hard": (0, 8), "mid": (3, 8), "easy": (8, 8),
                                "add_2": (4, 8), "add_3": (2, 8)})  # fmt: skip
    tasks = [task("hard"), task("mid"), task("easy"), task("new"),
             task("add_2", "add"), task("add_3", "add"), task("add_9", "add"),
             task("sub_1", "sub")]  # fmt: skip
    kept, left = cb.select(tasks, cal, (0.05, 0.95))
    assert [t.task_id for t in left] == ["hard", "easy"]
    assert [t.task_id for t in kept] == ["mid", "new", "add_2", "add_3", "add_9", "sub_1"]
    families = cb.family_counts(tasks, cal)
    assert families == {"add": (6, 16)}
    assert cb.pass_rate(task("add_9", "add"), cal, families) == 6 / 16
    assert cb.pass_rate(task("sub_1", "sub"), cal, families) is None


def test_files_round_trip_and_bad_ones_name_the_problem(tmp_path: Path) -> None:
    cal = cb.Calibration("m", 0.7, ["run"], {"a": (1, 2)})
    path = tmp_path / "cal.json"
    path.write_text(json.dumps(cal.to_json()))
    assert cb.load(path) == cal
    path.write_text(json.dumps({"tasks": {"a": [3, 2]}}))
    with pytest.raises(ValueError, match="3 passed of 2"):
        cb.load(path)
    with pytest.raises(ValueError, match="calibration"):
        cb.load(tmp_path / "missing.json")
    exported = tmp_path / "rewards.jsonl"
    exported.write_bytes(b"".join(logfiles.json_line(scored("x", "passed")) for _ in range(2)))
    assert cb.from_file(exported, cal) == 2 and cal.tasks["x"] == (2, 2)
    packed = tmp_path / "rewards.msgpack"
    packed.write_bytes(codec.encode(scored("x", "failed")))
    assert cb.from_file(packed, cal) == 1 and cal.tasks["x"] == (2, 3)
    exported.write_bytes(logfiles.json_line(scored("x", "passed").trajectory))
    with pytest.raises(ValueError, match="no ScoredTrajectory"):
        cb.from_file(exported, cal)


def test_an_earlier_calibration_file_adds_its_counts_and_sources(tmp_path: Path) -> None:
    old = tmp_path / "old.json"
    old.write_text(json.dumps(cb.Calibration("m", 0.7, ["run-1"], {"a": (1, 4)}).to_json()))
    fig = tmp_path / "eval.json"
    fig.write_text(json.dumps({"samples": 3, "sampled_passed": {"a": 1, "b": 2}}))
    cal = cb.Calibration("m", 0.7)
    assert cb.from_file(old, cal) == 1 and cb.from_file(fig, cal) == 2
    assert cal.tasks == {"a": (2, 8), "b": (2, 4)} and cal.sources == ["run-1"]
    old.write_text(json.dumps({"tasks": {"a": [5, 4]}}))
    with pytest.raises(ValueError, match="5 passed of 4"):
        cb.from_file(old, cal)


def test_the_packaged_calibration_covers_the_code_suite() -> None:
    from services import suites

    cal = cb.load("smollm2-code")
    train = suites.get("code").tasks("train")
    heldout = {t.task_id for t in suites.get("code").tasks("heldout")}
    assert not heldout & (set(cal.tasks) | set(cal.greedy)), "a held-out task was measured"
    assert set(cal.greedy) == {t.task_id for t in train}
    kept, left = cb.select(train, cal, (0.05, 0.95))
    assert kept and left and len(kept) + len(left) == len(train)


def test_the_feeder_leaves_out_tasks_measured_outside_the_band(tmp_path: Path) -> None:
    from services.rollout.feeder import Feeder
    from services.settings import Settings
    from services.suites import get

    train = [t.task_id for t in get("code").tasks("train")]
    path = tmp_path / "cal.json"
    counts = {train[0]: [0, 8], train[1]: [8, 8], train[2]: [3, 8]}
    path.write_text(json.dumps({"tasks": counts}))
    base = Settings()
    cfg = base.feeder.model_copy(update={"suites": {"code": 1.0}, "calibration": str(path)})
    fed = [c.task.task_id for c in Feeder(base.model_copy(update={"feeder": cfg})).candidates()
           if c.task is not None]  # fmt: skip
    assert train[0] not in fed and train[1] not in fed and train[2] in fed
    assert set(fed) == set(train) - {train[0], train[1]}


def test_cap_families_keeps_the_members_nearest_even_odds() -> None:
    cal = cb.Calibration(tasks={"add_1": (8, 8), "add_2": (4, 8), "add_3": (1, 8),
                                "sub_1": (2, 8)})  # fmt: skip
    tasks = [task("add_1", "add"), task("own"), task("add_2", "add"), task("add_3", "add"),
             task("sub_1", "sub"), task("sub_2", "sub"), task("sub_3", "sub")]  # fmt: skip
    kept, left = cb.cap_families(tasks, 2, cal)
    # add: 0.5 and 0.125 beat 1.0; sub: sub_1 measured 0.25, the others take the family's
    # pooled 0.25, so the earliest two stay. Tasks of no family always stay.
    assert [t.task_id for t in kept] == ["own", "add_2", "add_3", "sub_1", "sub_2"]
    assert [t.task_id for t in left] == ["add_1", "sub_3"]
    kept, left = cb.cap_families(tasks, 1)  # no calibration: the first member of each
    assert [t.task_id for t in kept] == ["add_1", "own", "sub_1"] and len(left) == 4


def test_the_feeder_caps_each_family_after_the_band() -> None:
    from services.rollout.feeder import Feeder
    from services.settings import Settings
    from services.suites import get

    train = get("code").tasks("train")
    families = {t.metadata["family"] for t in train if t.metadata.get("family")}
    base = Settings()
    cfg = base.feeder.model_copy(
        update={"suites": {"code": 1.0}, "calibration": "smollm2-code", "family_max": 2}
    )
    fed = [c.task for c in Feeder(base.model_copy(update={"feeder": cfg})).candidates()
           if c.task is not None]  # fmt: skip
    per_family = Counter(t.metadata["family"] for t in fed if t.metadata.get("family"))
    assert families and max(per_family.values()) == 2
    kept, _ = cb.select(train, cb.load("smollm2-code"), (0.05, 0.95))
    own = [t.task_id for t in kept if not t.metadata.get("family")]
    assert [t.task_id for t in fed if not t.metadata.get("family")] == own
