"""The learner as a service: everything built from `Settings`, then `Learner.run()`.

`rollstream learner` (services/cli_learner.py) calls `run_service`. SIGTERM/SIGINT stop it
cleanly (final publication and checkpoint); SIGKILL loses only the work since the last
checkpoint, which a restart redoes.
"""

from __future__ import annotations

import asyncio
import logging
import random
import signal
import socket
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from learner.checkpoint import CheckpointManager
from learner.kafka_io import KafkaIO
from learner.loop import Learner, LoopConfig, Summary
from learner.loss import LossConfig
from learner.metrics import LearnerMetrics
from learner.policy import Policy, build_policy
from learner.trainer import TrainConfig, Trainer, pick_device
from learner.weights import WeightStore, open_store
from schemas import topics

if TYPE_CHECKING:
    from learner.config import LearnerSettings
    from schemas.claimcheck import ClaimCheck
    from services.settings import Settings

log = logging.getLogger(__name__)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def policy_spec(ls: LearnerSettings) -> dict[str, object]:
    """The architecture the settings describe (generators build the same with it)."""
    if ls.model == "tiny":
        from learner.tiny import TinyConfig

        cfg = TinyConfig(
            dim=ls.tiny_dim, layers=ls.tiny_layers, heads=ls.tiny_heads, max_seq_len=ls.max_seq_len
        )
        return cfg.to_dict()
    return {"kind": "hf", "path": ls.model, "dtype": ls.hf_dtype}


def make_policy(ls: LearnerSettings) -> Policy:
    """The initial policy: seeded init for `tiny`, the saved weights for a HF directory."""
    torch.manual_seed(ls.seed)
    return build_policy(policy_spec(ls))


def train_config(ls: LearnerSettings) -> TrainConfig:
    return TrainConfig(
        lr=ls.lr,
        weight_decay=ls.weight_decay,
        grad_clip=ls.grad_clip,
        micro_batch_tokens=ls.micro_batch_tokens,
        minibatches=ls.minibatches,
        temperature=ls.temperature,
        amp=ls.amp,
        loss=LossConfig(
            clip_eps=ls.clip_eps,
            clip_eps_high=ls.clip_eps_high,
            is_cap=ls.is_cap,
            seq_mask_low=ls.seq_mask_low,
            seq_mask_high=ls.seq_mask_high,
            token_mask_low=ls.token_mask_low,
            token_mask_high=ls.token_mask_high,
            kl_coef=ls.kl_coef,
            entropy_coef=ls.entropy_coef,
            rwl_coef=ls.rwl_coef,
            rwl_beta=ls.rwl_beta,
            rwl_max_weight=ls.rwl_max_weight,
        ),
    )


def weight_store(settings: Settings) -> WeightStore:
    ls, prefix = settings.learner, settings.topics.prefix
    if ls.weight_store == "redis":
        return open_store(
            "redis",
            ls.policy,
            redis_url=settings.redis.endpoint,
            namespace=f"rollstream:{prefix}:weights",
            chunk_bytes=ls.redis_chunk_bytes,
            keep=ls.weight_keep,
        )
    root = (ls.weight_dir or settings.stack.state_dir / "weights") / prefix
    return open_store("dir", ls.policy, root=root, keep=ls.weight_keep)


def checkpoint_dir(settings: Settings) -> Path:
    ls = settings.learner
    return (
        (ls.checkpoint_dir or settings.stack.state_dir / "learner")
        / settings.topics.prefix
        / ls.policy
    )


def loop_config(settings: Settings, **limits: float | int | None) -> LoopConfig:
    ls, prefix = settings.learner, settings.topics.prefix
    return LoopConfig(
        policy=ls.policy,
        rewards_topic=topics.REWARDS.full_name(prefix),
        weights_topic=topics.WEIGHTS.full_name(prefix),
        ledger_topic=topics.LEDGER.full_name(prefix),
        dlq_topic=topics.DLQ.full_name(prefix),
        writer=f"learner@{socket.gethostname()}",
        max_lag=ls.max_lag,
        batch_tokens=ls.batch_tokens,
        batch_max_wait_s=ls.batch_max_wait_s,
        publish_every=ls.publish_every,
        checkpoint_every=ls.checkpoint_every,
        dedup_window=ls.dedup_window,
        **limits,  # type: ignore[arg-type]
    )


@dataclass
class Parts:
    """A built learner and the resources to close after it ran."""

    learner: Learner
    io: KafkaIO
    claim: ClaimCheck
    metrics: LearnerMetrics

    async def aclose(self) -> None:
        await self.io.stop()
        await self.claim.aclose()
        self.metrics.close()


def build(
    settings: Settings,
    limits: dict[str, float | int | None],
    store_hook: Callable[[WeightStore], WeightStore] | None = None,
) -> Parts:
    """Policy, trainer, weight store, checkpoints, Kafka, claim check and metrics."""
    from schemas.messages import ScoredTrajectory
    from services import blobs

    ls, prefix = settings.learner, settings.topics.prefix
    seed_everything(ls.seed)
    ref = make_policy(ls) if ls.kl_coef > 0 else None
    trainer = Trainer(make_policy(ls), train_config(ls), pick_device(ls.device), ref_policy=ref)
    store = weight_store(settings)
    if store_hook is not None:
        store = store_hook(store)
    io = KafkaIO(
        settings.kafka.endpoint,
        topics.REWARDS.full_name(prefix),
        group_id=f"{prefix}.learner.{ls.policy}",
        client_id=f"rollstream-learner-{ls.policy}",
    )
    claim = blobs.from_settings(settings)

    async def unpack(data: bytes) -> ScoredTrajectory:
        return await claim.unpack(data, ScoredTrajectory)

    tb_dir = None
    if ls.tensorboard:
        tb_dir = ls.tensorboard_dir or settings.stack.state_dir / "tensorboard" / prefix
    metrics = LearnerMetrics(ls.metrics_port, tb_dir)
    checkpoints = CheckpointManager(checkpoint_dir(settings), keep=ls.checkpoint_keep)
    cfg = loop_config(settings, **limits)
    learner = Learner(cfg, trainer, store, checkpoints, io, unpack, metrics)
    return Parts(learner, io, claim, metrics)


async def run_service(
    settings: Settings,
    *,
    max_steps: int | None = None,
    max_seconds: float | None = None,
    idle_exit_s: float | None = None,
    store_hook: Callable[[WeightStore], WeightStore] | None = None,
) -> Summary:
    """Run the learner until stopped (SIGTERM/SIGINT), or until a limit is reached."""
    from services import topics as topic_admin

    await topic_admin.ensure(settings)
    limits = {"max_steps": max_steps, "max_seconds": max_seconds, "idle_exit_s": idle_exit_s}
    parts = build(settings, limits, store_hook)
    trainer = parts.learner.trainer
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, parts.learner.request_stop)
    log.info(
        "learner on %s (autocast %s), prefix %s",
        trainer.device,
        trainer.amp_dtype,
        settings.topics.prefix,
    )
    try:
        await parts.io.start()
        return await parts.learner.run()
    finally:
        await parts.aclose()
        for sig in (signal.SIGTERM, signal.SIGINT):
            with suppress(NotImplementedError, RuntimeError):
                loop.remove_signal_handler(sig)
