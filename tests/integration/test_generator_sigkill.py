"""A generator SIGKILLed mid-group and restarted (a real `rollstream generator` process,
real Kafka) yields no group over group_size: the task of a group cut short is sampled
again, and the re-sampled members carry the same ids (group_id, index), so every group has
exactly group_size distinct members, indices 0..group_size-1."""

from __future__ import annotations

import asyncio
import random
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from schemas import codec, topics
from schemas.rollout import Trajectory
from services import kafka, suites
from services import topics as topic_admin
from services.settings import Settings
from tests.integration.dispatch_helpers import Service, service_env
from tests.integration.test_generator_hotswap import announce, states

GROUP, TASKS, KILLS = 8, 24, 3
MODEL = {"tiny_dim": 96, "tiny_layers": 2, "tiny_heads": 2, "max_seq_len": 96}


def run_settings(settings: Settings, prefix: str) -> Settings:
    return settings.model_copy(
        update={
            "topics": settings.topics.model_copy(update={"prefix": prefix}),
            "learner": settings.learner.model_copy(update=MODEL),
        }
    )


def child_env(prefix: str) -> dict[str, str]:
    extra = {f"ROLLSTREAM__LEARNER__{k.upper()}": str(v) for k, v in MODEL.items()}
    extra |= {"ROLLSTREAM__GENERATOR__PACING": "false", "ROLLSTREAM__GENERATOR__SEED": "0"}
    extra["ROLLSTREAM__GENERATOR__MAX_NEW_TOKENS"] = "48"
    return service_env(prefix, **extra)


class Reader:
    def __init__(self, s: Settings) -> None:
        self.s = s
        self.consumer = kafka.consumer(s, "test-sigkill")
        self.members: dict[str, dict[str, int]] = defaultdict(dict)
        self.records = 0

    async def start(self) -> None:
        await self.consumer.start()
        await kafka.assign_all(self.s, self.consumer, [kafka.topic(self.s, topics.TRAJECTORIES)])

    async def read(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            batches = await self.consumer.getmany(timeout_ms=100)
            for rec in (r for rs in batches.values() for r in rs):
                t: Any = codec.decode(rec.value, Trajectory)
                self.members[t.group_id][t.id] = t.index
                self.records += 1

    def complete(self) -> int:
        return sum(len(m) >= GROUP for m in self.members.values())


async def test_sigkill_mid_group_then_restart(
    settings: Settings, prefix: str, tmp_path: Path, _stack_up: None
) -> None:
    s = run_settings(settings, prefix)
    await topic_admin.ensure(s)
    producer = kafka.producer(s, "test-sigkill")
    await producer.start()
    await announce(s, producer, 0, states(s)[0])
    for t in suites.get("arith", group_size=GROUP).tasks("train")[:TASKS]:
        await producer.send_and_wait(kafka.topic(s, topics.TASKS), codec.encode(t), b"k")
    await producer.stop()
    reader = Reader(s)
    await reader.start()
    rng, env, log = random.Random(0), child_env(prefix), tmp_path / "generator.log"
    try:
        for _ in range(KILLS):  # kill each generator at a random point after its first group
            gen = Service(["generator"], env, log).start()
            seen = reader.records
            while reader.records == seen:
                assert gen.alive(), log.read_text()[-3000:]
                await reader.read(0.2)
            await asyncio.sleep(rng.uniform(0.0, 0.5))
            gen.kill()
            await reader.read(1.0)
        last = Service(["generator", "--idle-exit", "10"], env, log).start()
        deadline = time.monotonic() + 180
        while reader.complete() < TASKS and time.monotonic() < deadline:
            await reader.read(1.0)
        last.stop()
        await reader.read(2.0)
    finally:
        await reader.consumer.stop()
    assert len(reader.members) == TASKS, log.read_text()[-3000:]
    for group_id, members in reader.members.items():
        assert len(members) == GROUP, (group_id, len(members))
        assert sorted(members.values()) == list(range(GROUP))
    assert reader.records >= TASKS * GROUP


# Soak for now: it timed out once (400 s) on the merged tree under load; see the closing note.
pytestmark = [pytest.mark.timeout(400), pytest.mark.soak]
