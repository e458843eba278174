"""Per-task starting pass rates of a model, and the band of tasks worth training on. Pure.

RL on a small model learns from a group only when its samples disagree: a task the model
never solves gives a group of failures whose differences are partial credit at most, and
a task it always solves gives nothing. A calibration file records, per task, how many of
a model's completions passed; with `feeder.calibration` set, the feeder feeds only the
training tasks whose measured pass rate lies in `feeder.pass_band`. A task without
measurements is fed (no evidence against it); a family member (metadata `family`, the
same function with other constants) without measurements of its own takes the pooled
counts of its family.

A calibration may also record whether the model's greedy completion of a task passed.
With `feeder.skip_greedy_solved` the tasks it solves greedily are not fed: at a sampling
temperature below 1, RL mostly sharpens the policy towards its most likely answer, so on
a task whose greedy answer already passes it cannot raise greedy pass@1; the tasks greedy
decoding fails and sampling sometimes solves are the ones where it can.

File format (JSON, written by `rollstream calibrate`):

    {"model": "smollm2", "temperature": 0.7, "sources": ["..."],
     "tasks": {"code/abs_diff": [5, 8], ...},     # task id -> [passed, completions]
     "greedy": {"code/abs_diff": true, ...}}      # optional: task id -> greedy passed

Counts come from scored trajectories (a `rollstream export --topic rewards` log file) and
from `rollstream eval --json` figures (each sampled completion, and the greedy one, counts;
a greedy-only figure records the greedy outcomes and no counts).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from schemas.envelope import Message
from schemas.rollout import ScoredTrajectory, Task
from schemas.sandbox import Outcome


@dataclass
class Calibration:
    model: str = ""
    """The model the counts were measured on (informational)."""
    temperature: float | None = None
    """The sampling temperature of the counted completions (informational)."""
    sources: list[str] = field(default_factory=list)
    """Where the counts came from (run prefixes, files)."""
    tasks: dict[str, tuple[int, int]] = field(default_factory=dict)
    """Task id -> (completions that passed, completions)."""
    greedy: dict[str, bool] = field(default_factory=dict)
    """Task id -> whether the model's greedy completion passed (where measured)."""

    def add(self, task_id: str, passed: int, total: int) -> None:
        if not 0 <= passed <= total:
            raise ValueError(f"{task_id}: {passed} passed of {total} completions")
        p, n = self.tasks.get(task_id, (0, 0))
        self.tasks[task_id] = (p + passed, n + total)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "model": self.model, "temperature": self.temperature, "sources": self.sources,
            "tasks": {k: list(v) for k, v in sorted(self.tasks.items())},
        }  # fmt: skip
        if self.greedy:
            out["greedy"] = dict(sorted(self.greedy.items()))
        return out


PACKAGED = {"smollm2-code": "calibration-smollm2-code.json"}
"""Calibrations shipped in services/suites/data/: name -> file."""


def load(ref: str | Path) -> Calibration:
    """A calibration file, or a packaged one by name (ValueError, naming it, when it is
    missing or malformed)."""
    path = Path(ref)
    if str(ref) in PACKAGED:
        path = Path(__file__).parent / "data" / PACKAGED[str(ref)]
    try:
        raw = json.loads(path.read_text())
        cal = Calibration(str(raw.get("model", "")), raw.get("temperature"),
                          [str(s) for s in raw.get("sources", [])])  # fmt: skip
        for task_id, (passed, total) in dict(raw["tasks"]).items():
            cal.add(str(task_id), int(passed), int(total))
        for task_id, ok in dict(raw.get("greedy") or {}).items():
            if not isinstance(ok, bool):
                raise ValueError(f"greedy[{task_id!r}] = {ok!r}: expected true or false")
            cal.greedy[str(task_id)] = ok
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"calibration {ref}: {exc}") from None
    return cal


def from_scored(messages: Iterable[Message], cal: Calibration) -> int:
    """Count the `ScoredTrajectory` messages among `messages` (other kinds and masked ones
    are left out). Returns how many were counted."""
    n = 0
    for msg in messages:
        if isinstance(msg, ScoredTrajectory) and not msg.masked:
            cal.add(msg.trajectory.task_id, int(msg.outcome == Outcome.PASSED), 1)
            n += 1
    return n


def from_eval(fig: Mapping[str, Any], cal: Calibration) -> int:
    """Count a `rollstream eval --json` figure: with per-task sampled counts (`--samples
    K`) each sample and the greedy completion count, and the greedy outcomes are recorded;
    a greedy-only figure (its `task_ids`) records the greedy outcomes only (a greedy
    completion is no sample at the calibration's temperature). Returns the tasks."""
    sampled, k = fig.get("sampled_passed") or {}, int(fig.get("samples") or 0)
    greedy = set(fig.get("greedy_passed") or [])
    if sampled and k > 0:
        for task_id, passed in sampled.items():
            cal.add(task_id, int(passed) + (task_id in greedy), k + 1)
        ids = list(sampled)
    elif fig.get("task_ids"):
        ids = [str(t) for t in fig["task_ids"]]
    else:
        raise ValueError("an eval figure with per-task results is needed (rollstream eval --json)")
    for task_id in ids:
        cal.greedy[task_id] = task_id in greedy
    return len(ids)


def merge(other: Calibration, cal: Calibration) -> int:
    """Add the counts (and sources) of an earlier calibration; its greedy outcomes are
    taken where `cal` has none. Returns its tasks."""
    for task_id, (passed, total) in other.tasks.items():
        cal.add(task_id, passed, total)
    for task_id, ok in other.greedy.items():
        cal.greedy.setdefault(task_id, ok)
    cal.sources.extend(s for s in other.sources if s not in cal.sources)
    return len(other.tasks)


def from_file(path: Path, cal: Calibration) -> int:
    """Count a file: an eval figure (one JSON object with `greedy_passed` or
    `sampled_passed`), an earlier calibration file (one JSON object with `tasks`: its
    counts are added, so a calibration grows with new tasks) or a log file of `rollstream
    export` (JSONL or MessagePack, services/logfiles.py). Returns what `from_eval` /
    `merge` / `from_scored` return."""
    from services import logfiles

    if logfiles.kind_of(path) == "jsonl" and not path.name.endswith(".gz"):
        try:
            whole = json.loads(path.read_text())
        except ValueError:  # JSON Lines, not one document
            whole = None
        if isinstance(whole, dict) and ("greedy_passed" in whole or "sampled_passed" in whole):
            return from_eval(whole, cal)
        if isinstance(whole, dict) and "tasks" in whole:
            return merge(load(path), cal)
    n = from_scored((e.message for e in logfiles.read_file(path)), cal)
    if not n:
        raise ValueError(f"{path}: no ScoredTrajectory record (export the rewards topic)")
    return n


def family_counts(tasks: Iterable[Task], cal: Calibration) -> dict[str, tuple[int, int]]:
    """Pooled (passed, completions) of each family (metadata `family`) among `tasks`."""
    pools: dict[str, tuple[int, int]] = {}
    for t in tasks:
        family = (t.metadata or {}).get("family")
        if family and t.task_id in cal.tasks:
            p, n = pools.get(family, (0, 0))
            q, m = cal.tasks[t.task_id]
            pools[family] = (p + q, n + m)
    return pools


def pass_rate(
    task: Task, cal: Calibration, families: Mapping[str, tuple[int, int]] | None = None
) -> float | None:
    """The task's measured pass rate: its own counts, else its family's pooled counts
    (`families`, from `family_counts`), else None (never measured)."""
    p, n = cal.tasks.get(task.task_id, (0, 0))
    family = (task.metadata or {}).get("family")
    if not n and family and families:
        p, n = families.get(family, (0, 0))
    return p / n if n else None


def rates(tasks: Iterable[Task], cal: Calibration) -> dict[str, float | None]:
    """Task id -> measured pass rate (`pass_rate`, family counts pooled) of every task."""
    tasks = list(tasks)
    families = family_counts(tasks, cal)
    return {t.task_id: pass_rate(t, cal, families) for t in tasks}


def select(
    tasks: list[Task], cal: Calibration, band: tuple[float, float]
) -> tuple[list[Task], list[Task]]:
    """(kept, left out): tasks measured outside `band` (inclusive bounds) are left out."""
    lo, hi = band
    families = family_counts(tasks, cal)
    kept: list[Task] = []
    out: list[Task] = []
    for t in tasks:
        rate = pass_rate(t, cal, families)
        (kept if rate is None or lo <= rate <= hi else out).append(t)
    return kept, out


def cap_families(
    tasks: list[Task], most: int, cal: Calibration | None = None
) -> tuple[list[Task], list[Task]]:
    """(kept, left out): at most `most` members of each family (metadata `family`), the
    ones whose measured pass rate is nearest 0.5 (the likeliest to split a group), the
    earlier task on a tie; tasks of no family are all kept, in their order. A family of
    one function with other constants teaches that function once, not once per constant,
    so a capped pool spends its groups on more distinct functions."""
    families = family_counts(tasks, cal) if cal is not None else {}

    def distance(t: Task) -> float:
        rate = pass_rate(t, cal, families) if cal is not None else None
        return abs(rate - 0.5) if rate is not None else 0.5

    members: dict[str, list[tuple[float, int]]] = {}
    for i, t in enumerate(tasks):
        family = (t.metadata or {}).get("family")
        if family:
            members.setdefault(family, []).append((distance(t), i))
    left_out = {i for ranked in members.values() for _, i in sorted(ranked)[most:]}
    kept = [t for i, t in enumerate(tasks) if i not in left_out]
    return kept, [tasks[i] for i in sorted(left_out)]


def skip_greedy_solved(tasks: list[Task], cal: Calibration) -> tuple[list[Task], list[Task]]:
    """(kept, left out): the tasks whose greedy completion the calibration records as
    passing are left out; those it records as failing, or never measured greedily, are kept."""
    kept: list[Task] = []
    out: list[Task] = []
    for t in tasks:
        (out if cal.greedy.get(t.task_id) else kept).append(t)
    return kept, out
