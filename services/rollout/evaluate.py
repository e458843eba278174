"""Held-out evaluation: the pass rate of a policy on tasks it was never trained on.

Per task: one greedy completion (temperature 0) and `samples` sampled ones (the
generators' temperature and top-p), decoded in batches across tasks
(services/rollout/batched.py) and cut at the task's stop string. Each is judged by the
task's own verifier, with the same reward map as training: in-process verifiers right
here, sandboxed ones in a warm pool of hardened containers
(`services.sandbox_wiring.docker_sandbox`). pass@k uses the unbiased estimator
1 - C(n-c, k) / C(n, k) per task (n samples, c passed), averaged over tasks.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sandbox_workers.rewards import reward as reward_of
from sandbox_workers.verifiers import InProcessVerifier, default_registry
from schemas.envelope import new_id
from schemas.rollout import Task
from schemas.sandbox import Outcome, SandboxRequest
from services.rollout.batched import Decoding, complete
from streams.groups import extract_code

if TYPE_CHECKING:
    from services.settings import Settings

log = logging.getLogger("rollstream.eval")
Judge = Callable[[Task, str], Awaitable[tuple[float | None, bool]]]
"""(task, completion text) -> (reward or None when masked, passed)."""


@dataclass
class EvalResult:
    suite: str
    tasks: int
    greedy_pass: float
    """Share of tasks whose greedy completion passed (pass@1, greedy)."""
    sampled_pass: float
    """Share of sampled completions that passed (pass@1, sampled; NaN without samples)."""
    sampled_reward: float
    """Mean reward of the sampled completions (masked ones left out; NaN without any)."""
    passed: list[int] = field(default_factory=list)
    """Per task: sampled completions that passed."""
    samples: int = 0
    """Sampled completions per task."""
    greedy_passed: list[str] = field(default_factory=list)
    """Task ids whose greedy completion passed (for paired before/after comparisons)."""
    task_ids: list[str] = field(default_factory=list)
    """The tasks' ids, in the order of `passed`."""

    @property
    def greedy_se(self) -> float:
        """Binomial standard error of greedy_pass."""
        return binomial_se(self.greedy_pass, self.tasks)

    def pass_at(self, k: int) -> float:
        """Unbiased pass@k over the tasks (k <= samples)."""
        if not self.passed or k > self.samples:
            return float("nan")
        return sum(pass_at_k(self.samples, c, k) for c in self.passed) / len(self.passed)

    def pass_at_se(self, k: int) -> float:
        """Standard error of pass_at(k) (the per-task estimates' spread)."""
        values = [pass_at_k(self.samples, c, k) for c in self.passed]
        if len(values) < 2 or k > self.samples:
            return float("nan")
        mean = sum(values) / len(values)
        var = sum((v - mean) ** 2 for v in values) / (len(values) - 1)
        return math.sqrt(var / len(values))


def pass_at_k(n: int, c: int, k: int) -> float:
    """Chance that at least one of k of the n samples (c of them passing) passes."""
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def binomial_se(p: float, n: int) -> float:
    return math.sqrt(max(p * (1 - p), 0.0) / n) if n else float("nan")


def paired_change(before: list[str], after: list[str], n: int) -> tuple[int, int, float]:
    """(fixed, broken, SE of the change) of two greedy evaluations of the same `n` tasks,
    from the task ids each passed: tasks only `after` passed, tasks only `before` passed,
    and the standard error of the paired difference of pass rates,
    sqrt(f + b - (f - b)^2 / n) / n (McNemar's; NaN for n = 0)."""
    was, now = set(before), set(after)
    fixed, broken = len(now - was), len(was - now)
    if not n:
        return fixed, broken, float("nan")
    return fixed, broken, math.sqrt(max(fixed + broken - (fixed - broken) ** 2 / n, 0.0)) / n


async def evaluate(
    policy: Any,
    text: Any,
    tasks: list[Task],
    judge: Judge,
    settings: Settings,
    samples: int,
    batch: int = 16,
) -> EvalResult:
    """Greedy and `samples` sampled completions of every task (`batch` rows decoded
    together, on `learner.torch_threads` threads as training: 0 leaves torch's count),
    judged."""
    g, ls = settings.generator, settings.learner
    greedy = Decoding(g.max_new_tokens, seed=ls.seed + 1, batch=batch, threads=ls.torch_threads)
    sampled = Decoding(
        g.max_new_tokens, ls.temperature, g.top_p, ls.seed + 1, batch, threads=ls.torch_threads
    )
    t0 = time.monotonic()
    first = await asyncio.to_thread(complete, policy, text, tasks, 1, greedy)
    drawn = await asyncio.to_thread(complete, policy, text, tasks, samples, sampled)
    log.info("%d tasks: completions in %.0f s, judging", len(tasks), time.monotonic() - t0)
    return await judged(tasks, first, drawn, text, judge, samples)


async def judged(
    tasks: list[Task], greedy: list[Any], sampled: list[Any], text: Any, judge: Judge, n: int
) -> EvalResult:
    """The verdicts of per-task greedy (one each) and sampled (n each) completions."""

    async def verdicts(rows: list[Any]) -> list[tuple[float | None, bool]]:
        jobs = [judge(t, text.text(c.tokens)) for t, row in zip(tasks, rows, strict=True)
                for c in row]  # fmt: skip
        return list(await asyncio.gather(*jobs))

    first, drawn = await verdicts(greedy), await verdicts(sampled)
    rewards = [r for r, _ in drawn if r is not None]
    passed = [sum(ok for _, ok in drawn[i * n : (i + 1) * n]) for i in range(len(tasks))]
    return EvalResult(
        suite=tasks[0].suite if tasks else "",
        tasks=len(tasks),
        greedy_pass=sum(ok for _, ok in first) / max(1, len(first)),
        sampled_pass=sum(ok for _, ok in drawn) / len(drawn) if drawn else math.nan,
        sampled_reward=sum(rewards) / len(rewards) if rewards else math.nan,
        passed=passed if n else [],
        samples=n,
        greedy_passed=[t.task_id for t, (_, ok) in zip(tasks, first, strict=True) if ok],
        task_ids=[t.task_id for t in tasks],
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
