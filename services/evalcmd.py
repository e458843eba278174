"""`rollstream eval`: greedy pass@1 and pass@k of any policy on a suite or a task file.

The policy is the initial model (`initial`, the default), a version published under the
run's prefix (a number or `latest`: its announcement on `{prefix}.weights`, its weights
from the weight store, sha256-verified), or a safetensors file of a state dict. Tasks come
from a built-in suite (`--suite`, the `heldout` split unless `--split` says otherwise) or a
JSONL task file (`--tasks`, the format of `feeder.task_files`, README "Built-in suites and
task files"). Completions are decoded in batches across tasks and judged by the same
sandbox tier as training: a warm pool of hardened containers from the settings.
"""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from schemas.rollout import Task
    from services.rollout.evaluate import EvalResult
    from services.rollout.evaluate_turns import TurnsResult
    from services.settings import Settings


@dataclass(frozen=True)
class EvalRequest:
    policy: str = "initial"
    """`initial`, a published version (a number or `latest`), or a safetensors file."""
    suite: str | None = None
    tasks_file: Path | None = None
    split: str = "heldout"
    samples: int = 0
    """Sampled completions per task (pass@k for k <= samples); 0: greedy only."""
    limit: int | None = None
    """The first N tasks only."""
    batch: int = 16
    """Rows (prompts x samples) decoded together."""
    turns: int = 1
    """2: greedy two-turn episodes with public-test feedback (services/rollout/
    evaluate_turns.py): first-turn and final pass rates of the same tasks."""


def load_tasks(settings: Settings, req: EvalRequest) -> list[Task]:
    """The tasks to evaluate (ValueError when there are none)."""
    from services import suites

    if (req.suite is None) == (req.tasks_file is None):
        raise ValueError("name exactly one of --suite NAME or --tasks FILE.jsonl")
    if req.suite is not None:
        if req.suite not in suites.names():
            raise ValueError(f"unknown suite {req.suite!r} (known: {', '.join(suites.names())})")
        tasks = suites.get(req.suite, group_size=1).tasks(req.split)  # type: ignore[arg-type]
    else:
        assert req.tasks_file is not None
        tasks = _file_tasks(req.tasks_file)
    tasks = tasks[: req.limit] if req.limit is not None else tasks
    if not tasks:
        raise ValueError("no task to evaluate")
    return tasks


def _file_tasks(path: Path) -> list[Task]:
    from sandbox_workers.verifiers import default_registry
    from services.rollout import admission

    registry, out = default_registry(), []
    for number, line in admission.task_lines(path.read_text()):
        try:
            out.append(admission.parse_line(line, group_size=1, registry=registry))
        except admission.Rejected as exc:
            raise ValueError(f"{path}:{number}: {exc.reason}") from None
    return out


async def load_policy(settings: Settings, ref: str) -> tuple[Any, Any, str]:
    """(policy, text codec, label) of `ref` (see the module docstring)."""
    from learner.spec import make_policy
    from services.models import resolved
    from services.rollout.textcodec import for_policy

    policy = await asyncio.to_thread(make_policy, resolved(settings))
    label = f"{settings.learner.model} initial"
    if ref != "initial":
        state, label = await _weights(settings, ref)
        policy.load_weights(state)
    policy.train(False)
    return policy, for_policy(policy), label


def _file_weights(ref: str) -> tuple[dict[str, Any], str] | None:
    """The state dict of a safetensors file `ref` (None: `ref` names no file)."""
    path = Path(ref).expanduser()
    if path.suffix != ".safetensors" and not path.is_file():
        return None
    from safetensors.torch import load_file

    if not path.is_file():
        raise ValueError(f"--policy {ref}: no such file")
    return dict(load_file(str(path))), f"file {path.name}"


async def _weights(settings: Settings, ref: str) -> tuple[dict[str, Any], str]:
    from_file = await asyncio.to_thread(_file_weights, ref)
    if from_file is not None:
        return from_file
    if ref != "latest" and not ref.isdigit():
        raise ValueError(f"--policy {ref!r}: expected initial, latest, a version number or a file")
    update = await announcement(settings, None if ref == "latest" else int(ref))
    from learner.weights import fetch

    state = await asyncio.to_thread(
        fetch, update.uri, update.sha256, redis_url=settings.redis.endpoint
    )
    return state, f"{settings.learner.policy} v{update.version} ({settings.topics.prefix})"


async def announcement(settings: Settings, version: int | None) -> Any:
    """The WeightUpdate of `version` (None: the newest) on the prefix's weights topic."""
    from schemas import codec, topics
    from schemas.learning import WeightUpdate
    from services import kafka
    from services.kafka_read import read_topic

    records = await read_topic(settings, kafka.topic(settings, topics.WEIGHTS))
    key = settings.learner.policy.encode()
    updates = [codec.decode(r.value, WeightUpdate) for r in records if r.key == key and r.value]
    found = [u for u in updates if version is None or u.version == version]
    if not found:
        seen = sorted({u.version for u in updates})
        raise ValueError(f"no announcement of policy {settings.learner.policy!r} version "
                         f"{version if version is not None else '(any)'} under prefix "
                         f"{settings.topics.prefix!r}; announced: {seen or 'none'}")  # fmt: skip
    return max(found, key=lambda u: u.version)


async def run(settings: Settings, req: EvalRequest) -> dict[str, Any]:
    """Evaluate; returns the figures (what --json prints)."""
    import torch

    from services.rollout import evaluate

    if settings.learner.torch_threads:  # 0: torch's default, every core (as the learner)
        torch.set_num_threads(settings.learner.torch_threads)
    tasks = load_tasks(settings, req)
    if req.turns not in (1, 2):
        raise ValueError(f"--turns {req.turns}: expected 1 or 2")
    if req.turns == 2 and (req.samples or not all(t.verifier.needs_sandbox for t in tasks)):
        raise ValueError(
            "--turns 2 evaluates greedy episodes of sandboxed code tasks: no --samples, "
            "and a suite or task file judged in the sandbox"
        )
    policy, text, label = await load_policy(settings, req.policy)
    t0 = time.monotonic()
    if not any(t.verifier.needs_sandbox for t in tasks):
        judge = evaluate.in_process_judge(settings)
        result = await evaluate.evaluate(
            policy, text, tasks, judge, settings, req.samples, req.batch
        )
        return figures(result, label, req, time.monotonic() - t0, settings)
    from services.sandbox_wiring import docker_sandbox

    sandbox = await docker_sandbox(settings, f"{settings.topics.prefix}-eval")
    try:
        if req.turns == 2:
            from services.rollout import evaluate_turns

            run = evaluate_turns.sandbox_run(settings, sandbox)
            turns = await evaluate_turns.evaluate_two_turns(
                policy, text, tasks, run, settings, req.batch
            )
            return turn_figures(turns, label, req, time.monotonic() - t0, settings)
        judge = evaluate.sandbox_judge(settings, sandbox)
        result = await evaluate.evaluate(
            policy, text, tasks, judge, settings, req.samples, req.batch
        )
    finally:
        await sandbox.close()
    return figures(result, label, req, time.monotonic() - t0, settings)


def turn_figures(
    r: TurnsResult, label: str, req: EvalRequest, seconds: float, settings: Settings
) -> dict[str, Any]:
    """The figures of a two-turn evaluation (what --json prints)."""
    from services.rollout.evaluate import binomial_se

    return {
        "policy": label, "tasks": req.suite or str(req.tasks_file),
        "split": req.split if req.suite else None, "n_tasks": r.tasks, "turns": 2,
        "first_turn_pass": r.first_pass, "first_turn_se": binomial_se(r.first_pass, r.tasks),
        "two_turn_pass": r.final_pass, "two_turn_se": binomial_se(r.final_pass, r.tasks),
        "ratio": r.ratio, "second_turns": r.second_turns, "fixed": r.fixed, "broken": r.broken,
        "seconds": round(seconds, 1), "max_new_tokens": settings.generator.max_new_tokens,
    }  # fmt: skip


def figures(
    r: EvalResult, label: str, req: EvalRequest, seconds: float, settings: Settings
) -> dict[str, Any]:
    source = req.suite or str(req.tasks_file)
    out: dict[str, Any] = {
        "policy": label, "tasks": source, "split": req.split if req.suite else None,
        "n_tasks": r.tasks, "greedy_pass_at_1": r.greedy_pass, "greedy_se": r.greedy_se,
        "samples": r.samples, "pass_at_k": {}, "seconds": round(seconds, 1),
        "max_new_tokens": settings.generator.max_new_tokens,
        "temperature": settings.learner.temperature, "top_p": settings.generator.top_p,
        "greedy_passed": r.greedy_passed, "task_ids": r.task_ids,
        "sampled_passed": dict(zip(r.task_ids, r.passed, strict=True))
        if r.samples and r.task_ids
        else {},
    }  # fmt: skip
    for k in sorted({1, 2, 5, 10, r.samples} & set(range(1, r.samples + 1))):
        out["pass_at_k"][str(k)] = {"value": r.pass_at(k), "se": r.pass_at_se(k)}
    return out


def table(fig: dict[str, Any]) -> Any:
    """The figures as a rich table."""
    from rich.table import Table

    t = Table(title=f"{fig['policy']} on {fig['tasks']} ({fig['n_tasks']} tasks)", box=None)
    for col in ("metric", "value", "± SE"):
        t.add_column(col, justify="right" if col != "metric" else "left")
    if fig.get("turns") == 2:
        t.add_row("pass (greedy, first turn)", f"{fig['first_turn_pass']:.3f}",
                  f"{fig['first_turn_se']:.3f}")  # fmt: skip
        t.add_row("pass (greedy, after a second turn)", f"{fig['two_turn_pass']:.3f}",
                  f"{fig['two_turn_se']:.3f}")  # fmt: skip
        t.add_row("second turn / first turn", f"{fig['ratio']:.2f}", "")
        t.add_row("second turns (fixed / broken)",
                  f"{fig['second_turns']} ({fig['fixed']} / {fig['broken']})", "")  # fmt: skip
        t.caption = f"{fig['seconds']} s, max_new_tokens {fig['max_new_tokens']} per turn"
        return t
    t.add_row("pass@1 (greedy)", f"{fig['greedy_pass_at_1']:.3f}", f"{fig['greedy_se']:.3f}")
    for k, v in fig["pass_at_k"].items():
        se = "" if math.isnan(v["se"]) else f"{v['se']:.3f}"
        t.add_row(f"pass@{k} ({fig['samples']} samples, T={fig['temperature']})",
                  f"{v['value']:.3f}", se)  # fmt: skip
    t.caption = f"{fig['seconds']} s, max_new_tokens {fig['max_new_tokens']}"
    return t
