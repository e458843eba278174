"""(b) of benchmarks/pipeline.py: the classic synchronous RL loop, in one process.

Batch after batch: sample a batch of groups -> score every sample (in-process verifier, or
the sandbox pool, each job under its timeout) and wait for the slowest -> one learner step
-> repeat, for `minutes`. Weight snapshots every `eval_every_s` seconds for the held-out
curve (evaluated after the run, off the clock).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from schemas.rollout import Task
from services.settings import Settings


async def sync_run(
    s: Settings,
    state: dict[str, Any],
    tasks: list[Task],
    minutes: float,
    eval_every_s: float,
    threads: int = 1,
) -> dict[str, Any]:
    """`threads`: torch CPU threads for sampling and training (0: torch's default)."""
    import torch

    from learner.spec import make_policy
    from learner.trainer import Trainer, train_config
    from services.models import resolved
    from services.rollout import evaluate
    from services.rollout.sampler import SuiteSampler
    from services.rollout.textcodec import for_policy
    from services.sandbox_wiring import docker_sandbox

    if threads:
        torch.set_num_threads(threads)
    torch.manual_seed(s.learner.seed)
    policy = make_policy(resolved(s))
    policy.load_weights(state)
    text = for_policy(policy)
    trainer = Trainer(policy, train_config(s.learner), torch.device("cpu"))
    sampler = SuiteSampler(s.feeder.suites, seed=s.feeder.seed)
    sampler.add_all(tasks)
    sandbox = await docker_sandbox(s, f"{s.topics.prefix}-sync")
    judges = {True: evaluate.sandbox_judge(s, sandbox), False: evaluate.in_process_judge(s)}
    rng = torch.Generator().manual_seed(s.generator.seed or 0)
    log: list[tuple[float, float]] = []  # (seconds since start, reward) per scored sample
    snapshots: list[tuple[float, dict[str, Any]]] = [(0.0, policy.weights())]
    steps, t0 = 0, time.monotonic()
    try:
        while time.monotonic() - t0 < minutes * 60:
            groups = _sample_batch(policy, text, sampler, s, rng)
            scored = await _score(groups, judges, text)
            now = time.monotonic() - t0
            log += [(now, r) for _, rs in scored for r in rs if r is not None]
            batch = _samples(scored)
            if batch:
                await asyncio.to_thread(trainer.step, batch)
                steps += 1
            now = time.monotonic() - t0
            if now - snapshots[-1][0] >= eval_every_s:
                snapshots.append((now, policy.weights()))
    finally:
        await sandbox.close()
    elapsed = time.monotonic() - t0
    snapshots.append((elapsed, policy.weights()))
    return {"mode": "sync", "log": log, "seconds": elapsed, "steps": steps,
            "snapshots": snapshots, "stale_drops": 0, "settled": len(log)}  # fmt: skip


def _sample_batch(policy: Any, text: Any, sampler: Any, s: Settings, rng: Any) -> list[tuple]:
    """Groups (task, prompt ids, completions) until the learner's token budget is full."""
    groups, tokens = [], 0
    while tokens < s.learner.batch_tokens:
        task = sampler.next()
        ids = text.prompt_ids(task)
        cs = policy.sample(
            ids, task.group_size, max_new_tokens=s.generator.max_new_tokens,
            temperature=s.learner.temperature, top_p=s.generator.top_p, generator=rng,
        )  # fmt: skip
        groups.append((task, ids, cs))
        tokens += sum(len(ids) + len(c.tokens) for c in cs)
    return groups


async def _score(groups: list[tuple], judges: dict[bool, Any], text: Any) -> list[tuple]:
    """Score every sample of the batch; returns when the slowest verification is done."""
    jobs = []
    for task, _, cs in groups:
        judge = judges[task.verifier.needs_sandbox]
        jobs.append(asyncio.gather(*(judge(task, text.text(c.tokens)) for c in cs)))
    verdicts = await asyncio.gather(*jobs)
    return [(g, [r for r, _ in v]) for g, v in zip(groups, verdicts, strict=True)]


def _samples(scored: list[tuple]) -> list[Any]:
    import numpy as np

    from learner.sample import Sample
    from streams.groups import group_advantages

    out = []
    for (task, ids, cs), rewards in scored:
        live = [(c, r) for c, r in zip(cs, rewards, strict=True) if r is not None]
        advantages = group_advantages([r for _, r in live])
        for (c, r), a in zip(live, advantages, strict=True):
            if not c.tokens:
                continue
            out.append(
                Sample(
                    trajectory_id="", group_id="", prompt=np.array(ids, np.int32),
                    completion=np.array(c.tokens, np.int32), advantage=a, reward=r,
                    behaviour_logp=np.array(c.logprobs, np.float32), policy_version=0,
                    task_id=task.task_id,
                )
            )  # fmt: skip
    return out
