"""`rollstream learner`'s composition: the learner (learner/service.py) with the real
adapters, everything resolved from `Settings`.

Wires in the aiokafka `LearnerIO` (services/learner_kafka.py), the claim check of the
run (services/blobs.py) as the rewards decoder, the weight store (Redis or a directory),
the checkpoint and TensorBoard directories under the stack's state_dir, and makes sure the
topics exist (services/topics.py) before the learner starts. With several ranks
(`--nproc N`, services/learner_launch.py, or torchrun) only rank 0 gets these ports.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
from collections.abc import Callable
from contextlib import suppress
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from learner.bookkeeping import Summary
    from learner.weights import WeightStore
    from services.learner_lease import LearnerLease
    from services.settings import Settings

log = logging.getLogger(__name__)


def weight_store(settings: Settings) -> WeightStore:
    """Where the learner publishes weights (and generators fetch them from)."""
    from learner.weights import open_store

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
    """The policy's checkpoints: `{checkpoint_dir}/{prefix}/{policy}`."""
    ls = settings.learner
    return (
        (ls.checkpoint_dir or settings.stack.state_dir / "learner")
        / settings.topics.prefix
        / ls.policy
    )


def tensorboard_dir(settings: Settings) -> Path | None:
    ls = settings.learner
    if not ls.tensorboard:
        return None
    return ls.tensorboard_dir or settings.stack.state_dir / "tensorboard" / settings.topics.prefix


async def run_service(
    settings: Settings,
    *,
    max_steps: int | None = None,
    max_seconds: float | None = None,
    idle_exit_s: float | None = None,
    store_hook: Callable[[WeightStore], WeightStore] | None = None,
) -> Summary:
    """Run the learner until stopped (SIGTERM/SIGINT), or until a limit is reached. It
    first takes its policy's lease (services/learner_lease.py), as a standby while another
    learner holds it.

    On a rank other than 0 of a data-parallel job (torchrun's environment): follow rank 0,
    touching no Kafka, Redis or file (learner/parallel.py); the summary has its steps."""
    from learner import service
    from learner.bookkeeping import Summary
    from learner.distributed import DistEnv
    from services import topics as topic_admin
    from services.learner_lease import LearnerLease
    from services.models import resolved

    if not DistEnv.from_env().is_main:
        return Summary(steps=service.follow(resolved(settings)))
    await topic_admin.ensure(settings)
    lease = LearnerLease.from_settings(settings)
    try:
        if not await _standby(lease):
            return Summary()
        return await _serve(settings, lease, store_hook, max_steps, max_seconds, idle_exit_s)
    finally:
        await lease.release()


async def _standby(lease: LearnerLease) -> bool:
    """Wait for the lease; SIGTERM/SIGINT meanwhile: False."""
    loop, stop = asyncio.get_running_loop(), asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    try:
        return await lease.acquire(stop)
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            with suppress(NotImplementedError, RuntimeError):
                loop.remove_signal_handler(sig)


async def _serve(
    settings: Settings,
    lease: LearnerLease,
    store_hook: Callable[[WeightStore], WeightStore] | None,
    *limit_values: float | int | None,
) -> Summary:
    from learner import service
    from schemas.messages import ScoredTrajectory
    from services import blobs
    from services.learner_kafka import KafkaIO
    from services.learner_lease import FencedStore, fence_checkpoints
    from services.models import resolved

    section = await asyncio.to_thread(resolved, settings)
    store = weight_store(settings)
    if store_hook is not None:
        store = store_hook(store)
    io = KafkaIO(settings, settings.learner.policy)
    io.guard = lease.check
    claim = blobs.from_settings(settings)

    async def unpack(data: bytes) -> ScoredTrajectory:
        return await claim.unpack(data, ScoredTrajectory)

    ports = service.Ports(
        prefix=settings.topics.prefix,
        io=io,
        unpack=unpack,
        store=FencedStore(store, lease),
        checkpoint_dir=checkpoint_dir(settings),
        tensorboard_dir=tensorboard_dir(settings),
        writer=f"learner@{socket.gethostname()}",
    )
    limits = dict(zip(("max_steps", "max_seconds", "idle_exit_s"), limit_values, strict=True))
    learner = None
    try:
        learner = service.build(section, ports, **limits)
        lease.on_lost = learner.request_stop
        fence_checkpoints(learner.ckpt, lease)
        log.info("learner of policy %s, prefix %s", settings.learner.policy, ports.prefix)
        await io.start()
        return await service.serve(learner, service.announcer(settings.learner, ports.prefix))
    finally:
        await io.stop()
        await claim.aclose()
        if learner is not None and learner.metrics is not None:
            learner.metrics.close()
