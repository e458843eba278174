"""The learner as a service, from its `[learner]` section and its ports; no Kafka client,
no settings object, no services import.

`build(section, ports)` makes the policy, the trainer, the checkpoints, the metrics and the
loop; `serve(learner)` runs it until SIGTERM/SIGINT (final publication and checkpoint) or a
limit; the caller then closes the ports and `learner.metrics`. SIGKILL loses only the work
since the last checkpoint, which a restart redoes. The real ports (the aiokafka
`LearnerIO`, the claim check's unpack, the weight store, the directories) are wired in by
services/learner_service.py (`rollstream learner`).

Data-parallel (learner/parallel.py): with several ranks in the environment (torchrun's
RANK/WORLD_SIZE...), rank 0 runs `build` + `serve` with the ports as above and drives the
others; every other rank runs `follow(section)` and is given no ports at all.
"""

from __future__ import annotations

import asyncio
import logging
import random
import signal
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from learner import distributed, parallel
from learner.bookkeeping import Summary
from learner.checkpoint import CheckpointManager
from learner.config import LearnerSettings, configure
from learner.distributed import DistEnv
from learner.io import LearnerIO
from learner.loop import Learner, LoopConfig, Unpack
from learner.metrics import LearnerMetrics
from learner.parallel import DataParallelTrainer, ReplicaCheckpoints
from learner.progress import Announcer
from learner.spec import make_policy
from learner.trainer import Trainer, pick_device, train_config
from learner.weights import WeightStore
from schemas import topics

log = logging.getLogger(__name__)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def loop_config(section: LearnerSettings, prefix: str, **values: object) -> LoopConfig:
    """The loop of the run with topic prefix `prefix`; `values`: writer, poll_s, limits."""
    return configure(
        LoopConfig,
        section,
        rewards_topic=topics.REWARDS.full_name(prefix),
        weights_topic=topics.WEIGHTS.full_name(prefix),
        ledger_topic=topics.LEDGER.full_name(prefix),
        dlq_topic=topics.DLQ.full_name(prefix),
        **values,
    )


@dataclass(frozen=True)
class Ports:
    """What the learner is given: where its records, weights and files go."""

    prefix: str
    """Topic prefix of the run."""
    io: LearnerIO
    unpack: Unpack
    """Decodes a `rewards` record (resolving a claim check)."""
    store: WeightStore
    checkpoint_dir: Path
    tensorboard_dir: Path | None
    writer: str
    """Who writes the ledger entries and dead letters."""


def trainer(section: LearnerSettings, env: DistEnv | None = None) -> Trainer:
    """The trainer of this process: a `DataParallelTrainer` when `env` (default: torchrun's
    environment) has several ranks (the process group is joined here), else a `Trainer`.
    Sets torch's CPU threads to `learner.torch_threads` when that is not 0."""
    env = env or DistEnv.from_env()
    if section.torch_threads:
        torch.set_num_threads(section.torch_threads)
    seed_everything(section.seed)
    ref = make_policy(section) if section.kl_coef > 0 else None
    device = distributed.rank_device(pick_device(section.device), env)
    policy, cfg = make_policy(section), train_config(section)
    if not env.distributed:
        return Trainer(policy, cfg, device, ref_policy=ref)
    distributed.init_process_group(env, device)
    return DataParallelTrainer(policy, cfg, device, parallel=section.parallel, ref_policy=ref)


def follow(section: LearnerSettings) -> int:
    """A rank other than 0: train as rank 0 commands, until it stops; no Kafka, no Redis,
    no files. Returns the steps taken."""
    for sig in (signal.SIGTERM, signal.SIGINT):  # rank 0 stops the job, or the launcher
        signal.signal(sig, signal.SIG_IGN)
    t = trainer(section)
    if not isinstance(t, DataParallelTrainer) or t.rank == 0:
        raise RuntimeError("learner.service.follow runs on ranks other than 0 only")
    try:
        return parallel.follow(t)
    finally:
        distributed.shutdown()


def build(section: LearnerSettings, ports: Ports, **limits: float | int | None) -> Learner:
    """Policy (and the reference policy when kl_coef > 0), trainer, checkpoints, metrics and
    the loop. `limits`: max_steps, max_seconds, idle_exit_s. On rank 0 of a data-parallel
    job the trainer drives the other ranks and checkpoints hold the full state."""
    t = trainer(section)
    metrics = LearnerMetrics(section.metrics_port, ports.tensorboard_dir)
    checkpoints = CheckpointManager(ports.checkpoint_dir, keep=section.checkpoint_keep)
    if isinstance(t, DataParallelTrainer):
        checkpoints = ReplicaCheckpoints(ports.checkpoint_dir, t, keep=section.checkpoint_keep)
    cfg = loop_config(section, ports.prefix, writer=ports.writer, **limits)
    return Learner(cfg, t, ports.store, checkpoints, ports.io, ports.unpack, metrics)


def announcer(section: LearnerSettings, prefix: str) -> Announcer:
    """The learner's progress announcements on the run's `progress` topic."""
    topic = topics.PROGRESS.full_name(prefix)
    return Announcer(topic, section.policy, section.progress_every_s)


async def serve(learner: Learner, progress: Announcer | None = None) -> Summary:
    """Run `learner` until SIGTERM/SIGINT asks it to stop cleanly, or a limit is reached;
    with `progress`, its settled-sample count is announced beside it."""
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, learner.request_stop)
    t = learner.trainer
    log.info("learner on %s (autocast %s)", t.device, t.amp_dtype)
    beside = asyncio.create_task(progress.run(learner, learner.io)) if progress else None
    try:
        return await learner.run()
    finally:
        if progress is not None and beside is not None:
            progress.stop.set()
            await beside
        if isinstance(t, DataParallelTrainer):  # the other ranks end with rank 0
            t.channel.command(distributed.Op.STOP)
            distributed.shutdown()
        for sig in (signal.SIGTERM, signal.SIGINT):
            with suppress(NotImplementedError, RuntimeError):
                loop.remove_signal_handler(sig)
