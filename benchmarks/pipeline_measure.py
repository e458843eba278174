"""Measurements shared by the pipeline benchmark's modes (benchmarks/pipeline.py): the
heavy-tailed verification cost, held-out greedy passes of weight snapshots taken during a
run, time-to-target, throughput over time."""

from __future__ import annotations

import math
import random
import statistics
from typing import Any

from schemas.rollout import Task
from services import suites
from services.settings import Settings
from services.suites.arith import MAX_A, Arith

COSTS = {
    # seconds a verification sleeps first, inside the sandbox: most are quick, a few slow
    "pareto": "min({cap}, 0.05 * _r.paretovariate(1.2))",
    "lognormal": "min({cap}, _r.lognormvariate(-2.3, 1.5))",
}


def cost_code(kind: str, cap: float = 6.0) -> str:
    """The Python line prepended to a task's tests: sleep a heavy-tailed time."""
    return f"import random as _r, time as _t\n_t.sleep({COSTS[kind].format(cap=cap)})\n"


WIDE = "arithw"
"""The suite name of the wider `arith` pool (`--arith-max` other than 100): fed from the
benchmark's task file, so it cannot collide with the built-in `arith`."""


def arith_suite(max_a: int = MAX_A) -> str:
    """The suite the `arith` tasks with first number below `max_a` are fed as."""
    return "arith" if max_a == MAX_A else WIDE


def arith_tasks(split: suites.Split, max_a: int = MAX_A) -> list[Task]:
    """`arith` tasks of `split` with first number below `max_a`: the built-in suite at 100,
    above it the wider universe as suite `arithw` (ids `arithw/A+B`, the split of
    `arith/A+B`: the 1000 built-in tasks keep theirs)."""
    import msgspec

    tasks = Arith(max_a=max_a).tasks(split)
    if arith_suite(max_a) == "arith":
        return tasks
    return [
        msgspec.structs.replace(t, suite=WIDE, task_id=t.task_id.replace("arith/", f"{WIDE}/", 1))
        for t in tasks
    ]


def heldout_tasks(n: int, max_a: int = MAX_A) -> list[Task]:
    """`n` held-out tasks: the first `n` of the built-in suite, or of a wider universe `n`
    spread evenly over it (so the held-out set has the training pool's distribution)."""
    held = arith_tasks("heldout", max_a)
    if arith_suite(max_a) == "arith" or n >= len(held):
        return held[:n]
    return [held[i * len(held) // n] for i in range(n)]


async def greedy_pass(s: Settings, policy: Any, text: Any, tasks: list[Task]) -> float:
    """Share of held-out tasks whose greedy completion passes (in-process verifier)."""
    import asyncio

    from services.rollout import evaluate

    judge = evaluate.in_process_judge(s)
    policy.train(False)
    jobs = []
    for task in tasks:
        ids = text.prompt_ids(task)
        (c,) = policy.sample(ids, 1, max_new_tokens=s.generator.max_new_tokens, temperature=0.0)
        jobs.append(judge(task, text.text(c.tokens)))
    verdicts = await asyncio.gather(*jobs)
    return sum(ok for _, ok in verdicts) / max(1, len(verdicts))


async def curve(
    s: Settings, snapshots: list[tuple[float, dict[str, Any]]], n: int, max_a: int = MAX_A
) -> list:
    """[[seconds, held-out greedy pass]] of each (seconds, weights) snapshot."""
    from learner.spec import make_policy
    from services.models import resolved
    from services.rollout.textcodec import for_policy

    policy = make_policy(resolved(s))
    text, tasks, out = for_policy(policy), heldout_tasks(n, max_a), []
    for t, state in snapshots:
        policy.load_weights(state)
        out.append([round(t, 1), round(await greedy_pass(s, policy, text, tasks), 4)])
    return out


def time_to(points: list[list[float]], target: float) -> float:
    """First time the held-out curve reaches `target` (inf: never)."""
    return next((t for t, v in points if v >= target - 1e-9), math.inf)


def rates(times: list[float], bucket_s: float = 10.0, until: float | None = None) -> list:
    """[[bucket middle, samples/s]] from the arrival time of every scored sample."""
    if not times:
        return []
    end = until if until is not None else max(times)
    counts = [0] * (int(end // bucket_s) + 1)
    for t in times:
        if t <= end:
            counts[int(t // bucket_s)] += 1
    full = counts[:-1] if end % bucket_s < bucket_s / 2 and len(counts) > 1 else counts
    return [[(i + 0.5) * bucket_s, c / bucket_s] for i, c in enumerate(full)]


def dip(points: list[list[float]], after_s: float = 60.0) -> tuple[float, float]:
    """(median rate, lowest rate after `after_s`) of a throughput curve."""
    values = [r for _, r in points]
    late = [r for t, r in points if t >= after_s]
    if not values:
        return 0.0, 0.0
    return statistics.median(values), (min(late) if late else math.nan)


def median(values: list[float]) -> float:
    return statistics.median(values) if values else math.nan


def ttt_ratio(curves: dict[str, list[list[list[float]]]]) -> float:
    """sync / async median time-to-target, the target being the lower of the two modes'
    median final held-out values (`curves`: mode -> one held-out curve per seed)."""
    target = min(median([c[-1][1] for c in cs]) for cs in curves.values())
    a, b = (median([time_to(c, target) for c in curves[m]]) for m in ("async", "sync"))
    return b / a if a else (math.nan if not b else math.inf)  # inf / inf: nan


def ttt_ratio_interval(
    curves: dict[str, list[list[list[float]]]], level: float = 0.8, draws: int = 2000, seed: int = 0
) -> tuple[float, float]:
    """Bootstrap interval of `ttt_ratio` over seeds: each draw resamples every mode's seeds
    with replacement and recomputes target, times and ratio (nan draws left out)."""
    rng = random.Random(seed)
    out = []
    for _ in range(draws):
        r = ttt_ratio({m: rng.choices(cs, k=len(cs)) for m, cs in curves.items()})
        if not math.isnan(r):
            out.append(r)
    if not out:
        return math.nan, math.nan
    out.sort()
    lo, hi = (1 - level) / 2, (1 + level) / 2
    return out[int(lo * (len(out) - 1))], out[int(hi * (len(out) - 1))]
