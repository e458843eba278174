"""(b) of benchmarks/pipeline.py: the classic synchronous RL loop, in one process.

Batch after batch: sample a batch of groups -> score every sample (in-process verifier, or
the sandbox pool, each job under its timeout) and wait for the slowest -> one learner step
-> repeat, for `minutes`. With `lag` > 0 the batch is sampled by the weights of `lag`
steps before (a synchronous loop whose samples are as stale as the async pipeline's: the
cost of staleness alone, corrected as the learner corrects it). The batch follows the
learner's rule: with `learner.skip_no_signal` the samples of advantage 0 are left out
(learner/signal.py), and the loop samples and scores again until `batch_tokens` of samples
that teach are in hand (each further round sized by the share of them seen so far). Weight
snapshots every `eval_every_s` seconds for the held-out curve (evaluated after the run,
off the clock).
"""

from __future__ import annotations

import asyncio
import collections
import functools
import time
from typing import Any

from schemas.rollout import Task
from services.rollout.sampler import group_flat_kind, informative, observe_group
from services.settings import Settings


async def sync_run(
    s: Settings,
    state: dict[str, Any],
    tasks: list[Task],
    minutes: float,
    eval_every_s: float,
    threads: int = 1,
    lag: int = 0,
) -> dict[str, Any]:
    """`threads`: torch CPU threads (0: torch's default); `lag`: see `_Trailing`."""
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
    behind = _Trailing(policy, lambda: make_policy(resolved(s)), state, lag)
    trainer = Trainer(policy, train_config(s.learner), torch.device("cpu"))
    sampler = SuiteSampler(s.feeder.suites, seed=s.feeder.seed)
    sampler.add_all(tasks)
    sandbox = await docker_sandbox(s, f"{s.topics.prefix}-sync")
    judges = {True: evaluate.sandbox_judge(s, sandbox), False: evaluate.in_process_judge(s)}
    rng = torch.Generator().manual_seed(s.generator.seed or 0)
    adapt = _adapter(sampler, s, tasks)
    log: list[tuple[float, float]] = []  # (seconds since start, reward) per scored sample
    tally = [0] * 6  # tokens scored, kept for training; groups, all equal, all failed, all passed
    snapshots: list[tuple[float, dict[str, Any]]] = [(0.0, policy.weights())]
    steps, t0, snapshot_steps, trained = 0, time.monotonic(), [0], 0
    try:
        while time.monotonic() - t0 < minutes * 60:
            sample = functools.partial(_sample_batch, behind.policy, text, sampler, s, rng)
            span = (t0, t0 + minutes * 60)
            batch = await _batch(sample, judges, text, s, log, tally, span, adapt)
            if batch:
                await asyncio.to_thread(trainer.step, batch)
                steps, trained = steps + 1, trained + len(batch)
                behind.stepped()
            now = time.monotonic() - t0
            if now - snapshots[-1][0] >= eval_every_s:
                snapshots.append((now, policy.weights()))
                snapshot_steps.append(steps)
    finally:
        await sandbox.close()
    elapsed = time.monotonic() - t0
    snapshots.append((elapsed, policy.weights()))
    snapshot_steps.append(steps)
    return {"mode": "sync", "log": log, "seconds": elapsed, "steps": steps,
            "snapshots": snapshots, "snapshot_steps": snapshot_steps, "stale_drops": 0,
            "settled": len(log), "trained": trained, "lag": lag, **_shares(tally)}  # fmt: skip


def _shares(tally: list[int]) -> dict[str, float]:
    """The shares of the groups whose rewards were all equal, all failed, all passed."""
    n = max(1, tally[2])
    return {"flat_groups": tally[3] / n, "all_failed": tally[4] / n, "all_passed": tally[5] / n}


class _Trailing:
    """What the sync loop samples with: the trained policy itself, or (`lag` > 0) a second
    policy holding the weights of `lag` learner steps before."""

    def __init__(self, trained: Any, make: Any, state: dict[str, Any], lag: int) -> None:
        self.trained, self.lag, self.policy = trained, lag, trained
        if lag:
            self.policy = make()
            self.policy.load_weights(state)
        self.history = collections.deque([state], maxlen=lag + 1)  # weights after each step

    def stepped(self) -> None:
        """After a learner step: the sampling weights move to those of `lag` steps before."""
        if self.lag:
            self.history.append(self.trained.weights())
            self.policy.load_weights(self.history[0])


async def _batch(
    sample: Any,
    judges: dict[bool, Any],
    text: Any,
    s: Settings,
    log: list,
    tally: list[int],
    span: tuple[float, float],
    adapt: Any = None,
) -> list[Any]:
    """Sample and score rounds until `batch_tokens` of trainable samples are in hand (one
    round unless samples are left out); each further round is sized by the share kept so
    far (`tally`: tokens scored, tokens kept, groups, all-equal ones, of them all failed and
    all passed; updated). Appends
    (seconds, reward) to `log`; `adapt` (with `feeder.adapt`) sees every scored round."""
    batch: list[Any] = []
    while time.monotonic() < span[1]:
        want = s.learner.batch_tokens - sum(x.length for x in batch)
        if want <= 0:
            break
        share = max(tally[1] / tally[0], 0.2) if tally[1] else 1.0
        groups = sample(int(want / share))
        scored = await _score(groups, judges, text)
        if adapt is not None:
            adapt(scored)
        now = time.monotonic() - span[0]
        log += [(now, r) for _, rs, _ in scored for r in rs if r is not None]
        fresh = _samples(scored, s)
        tally[0] += sum(len(ids) + len(c.tokens) for _, ids, cs in groups for c in cs)
        tally[1] += sum(x.length for x in fresh)
        tally[2] += len(scored)
        kinds = [group_flat_kind(list(zip(rs, ok, strict=True))) for _, rs, ok in scored]
        tally[3] += sum(k is not None for k in kinds)
        tally[4] += kinds.count("failed")
        tally[5] += kinds.count("passed")
        batch += fresh
    return batch


def _adapter(sampler: Any, s: Settings, tasks: list[Task]) -> Any:
    """What sees every scored round: `feeder.adapt` and `feeder.frontier` as the feeder
    applies them (services/rollout/adapting.py), or None when both are off."""
    frontier = None
    if s.feeder.frontier and s.feeder.calibration:
        from services.rollout.frontier import Frontier
        from services.suites import calibration

        frontier = Frontier.of(tasks, calibration.load(s.feeder.calibration), s.feeder.adapt_floor)
        sampler.prior = frontier.chance
    if not s.feeder.adapt and frontier is None:
        return None
    return functools.partial(_adapt, sampler, {}, s.feeder, frontier)


def _adapt(
    sampler: Any, history: dict[str, Any], cfg: Any, frontier: Any, scored: list[Any]
) -> None:
    """Every completed group moves its task's sampling chance (and, with `adapt_suites`, its
    suite's) under `feeder.adapt`, and refits the frontier's shift."""
    for (task, _, _), rewards, _ in scored:
        if any(r is None for r in rewards):
            continue  # a group with a masked member never completes in the feeder's tally
        if cfg.adapt:
            group = (task.task_id, task.suite, informative(rewards))
            observe_group(sampler, history, group, cfg.adapt_floor, cfg.adapt_suites)
        if frontier is not None:
            frontier.observe(task.task_id, rewards)


def _sample_batch(
    policy: Any, text: Any, sampler: Any, s: Settings, rng: Any, budget: int
) -> list[tuple]:
    """Groups (task, prompt ids, completions) until `budget` tokens are sampled."""
    groups, tokens = [], 0
    while tokens < budget:
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
    """Score every sample of the batch: (group, rewards, passed) each; returns when the
    slowest verification is done."""
    jobs = []
    for task, _, cs in groups:
        judge = judges[task.verifier.needs_sandbox]
        jobs.append(asyncio.gather(*(judge(task, text.text(c.tokens)) for c in cs)))
    verdicts = await asyncio.gather(*jobs)
    return [
        (g, [r for r, _ in v], [ok for _, ok in v]) for g, v in zip(groups, verdicts, strict=True)
    ]


def _samples(scored: list[tuple], s: Settings) -> list[Any]:
    """The learner's samples of a scored batch (no-signal ones left out, as the learner's
    loop leaves them out)."""
    import numpy as np

    from learner.sample import Sample
    from learner.signal import no_signal_reason
    from streams.groups import group_advantages

    out = []
    for (task, ids, cs), rewards, _ in scored:
        live = [(c, r) for c, r in zip(cs, rewards, strict=True) if r is not None]
        advantages = group_advantages([r for _, r in live])
        for (c, r), a in zip(live, advantages, strict=True):
            if not c.tokens:
                continue
            if s.learner.skip_no_signal and no_signal_reason(
                a, True, kl_coef=s.learner.kl_coef, entropy_coef=s.learner.entropy_coef
            ):
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
