"""Pacing against a deliberately slow learner (real Kafka): the learner settles two
trajectories every half second and never publishes new weights (as when every sample in
flight is dropped as stale); the generator is held back so that what it has outstanding
never exceeds (max_lag + 1) x batch, and it keeps producing as the learner settles (no
stall, no escape hatch)."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import pytest

from schemas import codec, topics
from schemas.learning import Progress
from schemas.rollout import Trajectory
from services import kafka
from services import topics as topic_admin
from services.rollout.generator import Generator
from services.settings import Settings
from tests.integration.test_generator_hotswap import announce, feed, states

MAX_LAG, BATCH, GROUP = 1, 4, 2
WINDOW = (MAX_LAG + 1) * BATCH


def run_settings(settings: Settings, prefix: str) -> Settings:
    return settings.model_copy(
        update={
            "topics": settings.topics.model_copy(update={"prefix": prefix}),
            "learner": settings.learner.model_copy(
                update={
                    "tiny_dim": 32,
                    "tiny_layers": 1,
                    "tiny_heads": 2,
                    "max_seq_len": 64,
                    "max_lag": MAX_LAG,
                }
            ),
            "generator": settings.generator.model_copy(
                update={"pacing": True, "batch_samples": BATCH, "max_new_tokens": 6, "seed": 0}
            ),
        }
    )


class SlowLearner:
    """Reads `trajectories`, settles two of them every `every_s`, announces its count on
    `progress` (and nothing on `weights`), and checks the window at every settlement."""

    def __init__(self, s: Settings, producer: Any) -> None:
        self.s, self.producer = s, producer
        self.consumer = kafka.consumer(s, "test-slow-learner")
        self.seen: set[str] = set()
        self.consumed = 0
        self.worst = 0

    async def run(self, settle: int, every_s: float = 0.5) -> None:
        await self.consumer.start()
        await kafka.assign_all(self.s, self.consumer, [kafka.topic(self.s, topics.TRAJECTORIES)])
        try:
            while self.consumed < settle:
                await self._read()
                self.worst = max(self.worst, len(self.seen) - self.consumed)
                self.consumed = min(len(self.seen), self.consumed + 2)
                msg = Progress(
                    source=f"learner/{self.s.learner.policy}", policy=self.s.learner.policy,
                    samples_consumed=self.consumed, version=0,
                )  # fmt: skip
                topic = kafka.topic(self.s, topics.PROGRESS)
                await self.producer.send_and_wait(topic, codec.encode(msg), msg.source.encode())
                await asyncio.sleep(every_s)
            await self._read()
            self.worst = max(self.worst, len(self.seen) - self.consumed)
        finally:
            await self.consumer.stop()

    async def _read(self) -> None:
        batches = await self.consumer.getmany(timeout_ms=200)
        for rec in (r for rs in batches.values() for r in rs):
            traj = codec.decode(rec.value, Trajectory)
            self.seen.add(traj.id)


async def test_a_slow_learner_holds_the_generator_back_without_a_stall(
    settings: Settings, prefix: str, _stack_up: None
) -> None:
    s = run_settings(settings, prefix)
    await topic_admin.ensure(s)
    producer = kafka.producer(s, "test-pacing")
    await producer.start()
    stop = asyncio.Event()
    gen = Generator(s)
    running = asyncio.create_task(gen.run())
    feeding = asyncio.create_task(feed(s, producer, stop))
    learner = SlowLearner(s, producer)
    try:
        await announce(s, producer, 0, states(s)[0])
        await asyncio.wait_for(learner.run(settle=40), 150)
    finally:
        stop.set()
        gen.request_stop()
        feeding.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await feeding
        summary = await asyncio.wait_for(running, 60)
        await producer.stop()
    # the learner settled 40 (it only settles what it read): the generator kept producing
    assert learner.consumed >= 40 and summary.trajectories >= 40
    # and was held back: never more than the window outstanding, by either count
    assert summary.max_outstanding <= WINDOW
    assert learner.worst <= WINDOW
    assert summary.paced_s > 0
    assert len(learner.seen) <= learner.consumed + WINDOW


pytestmark = pytest.mark.timeout(300)
