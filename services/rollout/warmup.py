"""The demo's initial policy and how the learner starts from it.

A randomly initialised byte-level model almost never writes a right answer, so RL would
have nothing to reinforce. Like a real post-training run starts from a pretrained model,
the demo starts from a policy briefly trained with supervision (`demo.warmup_steps`
steps, seconds on a CPU) on the `warmup` split of the suites: disjoint from the tasks
that are fed (`train`) and from those evaluated (`heldout`). It learns the output format
and a little of the skill, so its reward is low but not zero; RL has to do the rest.

`seed_learner` makes that policy version 0 of the run: the blob goes to the weight store,
a checkpoint (step 0, version 0, fresh optimizer) to the learner's checkpoint directory,
and the announcement to `weights`, so the learner resumes from it and the generators load
it, through the same paths as every later version.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from schemas import codec, topics
from schemas.learning import WeightUpdate
from schemas.rollout import Task
from services import suites
from services.rollout.sampler import SuiteSampler

if TYPE_CHECKING:
    from services.settings import Settings


def warmup_pairs(settings: Settings) -> list[tuple[Task, str]]:
    """(task, correct completion) of the `warmup` split of every built-in suite fed."""
    out = []
    for name, weight in settings.feeder.suites.items():
        if weight > 0 and name in suites.names():
            suite = suites.get(name)
            out += [(t, suite.example(t)) for t in suite.tasks("warmup")]
    return out


def supervised(
    policy: Any,
    text: Any,
    pairs: list[tuple[Task, str]],
    settings: Settings,
    on_step: Callable[[int, float], None] | None = None,
) -> list[float]:
    """`demo.warmup_steps` steps of next-token cross-entropy on the completions (prompt
    tokens are context only), suites mixed by their feeder weights. Returns the losses."""
    import torch

    cfg = settings.demo
    if not pairs or cfg.warmup_steps == 0:
        return []
    sampler = SuiteSampler(settings.feeder.suites, seed=settings.learner.seed)
    target = {t.task_id: c for t, c in pairs}
    sampler.add_all(t for t, _ in pairs)
    rng = random.Random(settings.learner.seed)
    torch.manual_seed(rng.randrange(1 << 30))
    opt = torch.optim.AdamW(list(policy.trainable_parameters()), lr=cfg.warmup_lr)
    policy.train()
    losses = []
    for step in range(cfg.warmup_steps):
        batch = [_pick(sampler) for _ in range(cfg.warmup_batch)]
        rows = [(text.prompt_ids(t), [*text.ids(target[t.task_id]), policy.eos_id]) for t in batch]
        loss = _loss(policy, rows)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
        if on_step is not None:
            on_step(step, losses[-1])
    policy.eval()
    return losses


def _loss(policy: Any, rows: list[tuple[list[int], list[int]]]) -> Any:
    import torch

    width = max(len(p) + len(c) for p, c in rows)
    tokens = torch.full((len(rows), width), policy.pad_id, dtype=torch.long)
    attn = torch.zeros((len(rows), width), dtype=torch.long)
    mask = torch.zeros((len(rows), width - 1))
    for i, (p, c) in enumerate(rows):
        tokens[i, : len(p) + len(c)] = torch.tensor(p + c)
        attn[i, : len(p) + len(c)] = 1
        mask[i, len(p) - 1 : len(p) + len(c) - 1] = 1.0
    logp, _ = policy.token_logprobs(tokens, attn)
    return -(logp * mask).sum() / mask.sum()


async def seed_learner(settings: Settings, policy: Any) -> WeightUpdate:
    """Make `policy` version 0 of the run (see the module docstring)."""
    import asyncio

    from learner.checkpoint import CheckpointManager, CheckpointState
    from learner.trainer import Trainer, train_config
    from services import kafka
    from services.learner_service import checkpoint_dir, weight_store

    ls = settings.learner
    manager = CheckpointManager(checkpoint_dir(settings), keep=ls.checkpoint_keep)
    if manager.list():
        raise RuntimeError(f"{manager.root} already holds checkpoints: use a fresh topic prefix")
    import torch

    trainer = Trainer(policy, train_config(ls), torch.device("cpu"))
    stored = await asyncio.to_thread(weight_store(settings).put, 0, policy.weights())
    state = CheckpointState(
        version=0, step=0, extra={"dedup": [], "last_publish_step": 0, "seeded_by": "demo"}
    )
    path = manager.save(state, policy, trainer.optimizer)
    manager.mark_flushed(path)
    update = WeightUpdate(
        policy=ls.policy, version=0, step=0, uri=stored.uri, sha256=stored.sha256,
        size_bytes=stored.size_bytes,
    )  # fmt: skip
    producer = kafka.producer(settings, "rollstream-demo-seed")
    await producer.start()
    try:
        await producer.send_and_wait(
            kafka.topic(settings, topics.WEIGHTS), codec.encode(update), key=ls.policy.encode()
        )
    finally:
        await producer.stop()
    return update


def _pick(sampler: SuiteSampler) -> Task:
    task = sampler.next()
    if task is None:
        raise RuntimeError("warm-up: every suite is paused, no task to sample")
    return task
