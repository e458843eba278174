"""Task calibration of benchmarks/pipeline.py: its tasks, fitted to the shared initial policy.

RL on a small model learns from a group only when its samples disagree. Before the modes
run, every training task (`arith` train and `pyslow`) gets `k` samples of the shared
initial policy at the pipelines' temperature, each scored as the pipelines score it
(`arith` in process; `pyslow` in a sandbox pool, without its sleep: the cost line changes
how long a verification takes, not its verdict). The pass counts are written as a
calibration file (services/suites/calibration.py): the async pipeline's feeder reads it
(`feeder.calibration`, `feeder.pass_band`), and the sync loop and TRL get the same kept
tasks (`calibration.select`). Held-out tasks are never measured.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import Progress

from schemas.rollout import Task
from services.settings import Settings
from services.suites.calibration import Calibration


def _unslowed(task: Task, cost_line: str) -> Task:
    """The task with its sleep left out (the same tests and verdict)."""
    import msgspec

    tests = task.verifier.tests or ""
    if not tests.startswith(cost_line):
        return task
    spec = msgspec.structs.replace(task.verifier, tests=tests[len(cost_line) :])
    return msgspec.structs.replace(task, verifier=spec)


async def measure(
    s: Settings, state: dict[str, Any], tasks: list[Task], k: int, cost_line: str
) -> Calibration:
    """Pass counts (k completions per task) of the policy with weights `state`."""
    import torch

    from learner.spec import make_policy
    from services.models import resolved
    from services.rollout import evaluate
    from services.rollout.textcodec import for_policy
    from services.sandbox_wiring import docker_sandbox

    policy = make_policy(resolved(s))
    policy.load_weights(state)
    policy.train(False)
    text = for_policy(policy)
    rng = torch.Generator().manual_seed(20261206)
    cal = Calibration("tiny: the benchmark's initial policy", s.learner.temperature,
                      ["benchmarks/pipeline_calibrate.py"])  # fmt: skip
    sandbox = await docker_sandbox(s, f"{s.topics.prefix}-calibrate")
    judges = {True: evaluate.sandbox_judge(s, sandbox), False: evaluate.in_process_judge(s)}
    try:
        with Progress(transient=True) as progress:
            bar = progress.add_task("calibrating the tasks", total=len(tasks))
            for task in tasks:
                cs = policy.sample(
                    text.prompt_ids(task), k, max_new_tokens=s.generator.max_new_tokens,
                    temperature=s.learner.temperature, top_p=s.generator.top_p, generator=rng,
                )  # fmt: skip
                judge, plain = judges[task.verifier.needs_sandbox], _unslowed(task, cost_line)
                verdicts = await asyncio.gather(*(judge(plain, text.text(c.tokens)) for c in cs))
                cal.add(task.task_id, sum(ok for _, ok in verdicts), len(verdicts))
                progress.advance(bar)
    finally:
        await sandbox.close()
    return cal


def calibrate(
    s: Settings, state: dict[str, Any], tasks: list[Task], k: int, cost_line: str,
    out: Path, console: Console,
) -> list[Task]:  # fmt: skip
    """Measure, write `out` (a calibration file), print what is kept per suite and return
    the kept tasks (in `feeder.pass_band`)."""
    from services.suites import calibration

    cal = asyncio.run(measure(s, state, tasks, k, cost_line))
    out.write_text(json.dumps(cal.to_json()))
    kept, _ = calibration.select(tasks, cal, s.feeder.pass_band)
    for suite in sorted({t.suite for t in tasks}):
        n = sum(t.suite == suite for t in tasks)
        m = sum(t.suite == suite for t in kept)
        console.print(f"calibration: {suite}: {m} of {n} tasks pass {k} samples at a rate "
                      f"within {s.feeder.pass_band}")  # fmt: skip
    return kept
