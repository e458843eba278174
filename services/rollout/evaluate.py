"""Held-out evaluation: the pass rate of a policy on tasks it was never trained on.

Per task: one greedy completion (temperature 0) and `samples` sampled ones (the
generators' temperature and top-p). Each is judged by the task's own verifier, with the
same reward map as training: in-process verifiers right here, sandboxed ones in a warm
pool of hardened containers (`services.sandbox_wiring.docker_sandbox`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sandbox_workers.rewards import reward as reward_of
from sandbox_workers.verifiers import InProcessVerifier, default_registry
from schemas.envelope import new_id
from schemas.rollout import Task
from schemas.sandbox import Outcome, SandboxRequest
from streams.groups import extract_code

if TYPE_CHECKING:
    from services.settings import Settings

Judge = Callable[[Task, str], Awaitable[tuple[float | None, bool]]]
"""(task, completion text) -> (reward or None when masked, passed)."""


@dataclass
class EvalResult:
    suite: str
    tasks: int
    greedy_pass: float
    """Share of tasks whose greedy completion passed."""
    sampled_pass: float
    """Share of sampled completions that passed."""
    sampled_reward: float
    """Mean reward of the sampled completions (masked ones left out)."""


async def evaluate(
    policy: Any, text: Any, tasks: list[Task], judge: Judge, settings: Settings, samples: int
) -> EvalResult:
    import torch

    g = settings.generator
    rng = torch.Generator().manual_seed(settings.learner.seed + 1)
    jobs: list[Awaitable[tuple[float | None, bool]]] = []
    kinds: list[str] = []
    for task in tasks:
        ids = text.prompt_ids(task)
        greedy = policy.sample(ids, 1, max_new_tokens=g.max_new_tokens, temperature=0.0)
        sampled = policy.sample(
            ids, samples, max_new_tokens=g.max_new_tokens,
            temperature=settings.learner.temperature, top_p=g.top_p, generator=rng,
        )  # fmt: skip
        for kind, c in [("greedy", greedy[0])] + [("sampled", c) for c in sampled]:
            jobs.append(judge(task, text.text(c.tokens)))
            kinds.append(kind)
    verdicts = await asyncio.gather(*jobs)
    greedy_ok = [ok for k, (_, ok) in zip(kinds, verdicts, strict=True) if k == "greedy"]
    sampled = [(r, ok) for k, (r, ok) in zip(kinds, verdicts, strict=True) if k == "sampled"]
    rewards = [r for r, _ in sampled if r is not None]
    return EvalResult(
        suite=tasks[0].suite if tasks else "",
        tasks=len(tasks),
        greedy_pass=sum(greedy_ok) / max(1, len(greedy_ok)),
        sampled_pass=sum(ok for _, ok in sampled) / max(1, len(sampled)),
        sampled_reward=sum(rewards) / max(1, len(rewards)),
    )


def in_process_judge(settings: Settings) -> Judge:
    registry = default_registry()

    async def judge(task: Task, completion: str) -> tuple[float | None, bool]:
        plugin, why = registry.lookup(task.verifier)
        if not isinstance(plugin, InProcessVerifier):
            raise ValueError(why or f"{task.verifier.name} needs a sandbox")
        v = await plugin.judge(completion, task.verifier)
        r = reward_of(v.outcome, v.passed, v.total, settings.rewards)
        return r, v.outcome == Outcome.PASSED

    return judge


def sandbox_judge(settings: Settings, sandbox: Any) -> Judge:
    """Judge through a started `VerifyingSandbox` (its pool bounds the concurrency)."""
    d = settings.dispatcher

    async def judge(task: Task, completion: str) -> tuple[float | None, bool]:
        rid = f"eval-{new_id()}"
        result = await sandbox.run(
            SandboxRequest(
                request_id=rid, trajectory_id=rid, group_id=rid, task_id=task.task_id,
                code=extract_code(completion), verifier=task.verifier,
                timeout_s=d.sandbox_timeout_s, memory_mb=d.sandbox_memory_mb,
            )
        )  # fmt: skip
        r = reward_of(result.outcome, result.passed, result.total, settings.rewards)
        return r, result.outcome == Outcome.PASSED

    return judge
