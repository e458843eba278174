"""Helpers of the replay, ingest, audit and status integration tests: they need Kafka and
Redis of the local stack (not Docker), and read whole topics with bounded waits."""

from __future__ import annotations

import asyncio
import time
from typing import TypeVar

import pytest

from schemas import codec, topics
from schemas.envelope import Message
from schemas.learning import LedgerEntry, LedgerStatus
from schemas.rollout import ScoredTrajectory, Trajectory
from schemas.sandbox import Outcome, VerifierSpec
from services import kafka_read
from services.settings import Settings

from .dispatch_helpers import produce

M = TypeVar("M", bound=Message)


def require_kafka_redis(settings: Settings) -> None:
    from services.infra import kafka, redis_local

    down = [c for c in (kafka.probe(settings), redis_local.probe(settings)) if not c.healthy]
    if down:
        lines = "\n".join(f"  {c.component}: {c.detail} ({c.fix})" for c in down)
        pytest.fail(f"the local stack is not up; run `make up` (or `rollstream up`):\n{lines}")


async def read_all(settings: Settings, spec: topics.TopicSpec, kind: type[M]) -> list[M]:
    """Every record of the run's topic, decoded."""
    name = spec.full_name(settings.topics.prefix)
    return [codec.decode(r.value or b"", kind) for r in await kafka_read.read_topic(settings, name)]


async def wait_for(
    settings: Settings, spec: topics.TopicSpec, kind: type[M], want: int, timeout_s: float = 150
) -> list[M]:
    """The topic's records once there are at least `want` (polled once a second)."""
    deadline = time.monotonic() + timeout_s
    while True:
        found = await read_all(settings, spec, kind)
        if len(found) >= want or time.monotonic() > deadline:
            break
        await asyncio.sleep(1.0)
    assert len(found) >= want, f"{len(found)} of {want} {spec.name} records in {timeout_s} s"
    return found


async def commit_group(settings: Settings, group: str, topic: str, offsets: dict[int, int]) -> None:
    """Commit `offsets` of `topic` for consumer group `group` (as a service would)."""
    from aiokafka import AIOKafkaConsumer, TopicPartition

    c = AIOKafkaConsumer(
        bootstrap_servers=settings.kafka.endpoint, group_id=group, enable_auto_commit=False
    )
    await c.start()
    try:
        tps = {TopicPartition(topic, p): o for p, o in offsets.items()}
        c.assign(list(tps))
        await c.commit(tps)
    finally:
        await c.stop()


async def end_offsets(settings: Settings, topic: str) -> dict[int, int]:
    c = kafka_read.consumer(settings)
    await c.start()
    try:
        spans = await kafka_read.spans(settings, c, topic, kafka_read.Selection())
        return {s.partition: s.end for s in spans}
    finally:
        await c.stop()


VERIFIER = VerifierSpec(name="exact", answer="42", needs_sandbox=False)


def run_content(
    n_groups: int, policy_version: int = -1
) -> tuple[list[Trajectory], list[ScoredTrajectory], list[LedgerEntry]]:
    """A finished run: groups of 2; every trajectory scored; fates trained, dropped, masked."""
    trajs = [
        Trajectory(
            task_id="t",
            group_id=f"g{g}",
            group_size=2,
            index=i,
            verifier=VERIFIER,
            completion="42" if i else "41",
            policy_version=policy_version,
        )
        for g in range(n_groups)
        for i in range(2)
    ]
    scored = [
        ScoredTrajectory(
            id=f"{t.id}:scored",
            parent_id=t.id,
            trajectory=t,
            reward=float(t.index),
            outcome=Outcome.PASSED if t.index else Outcome.FAILED,
            passed=t.index,
            total=1,
        )
        for t in trajs
    ]
    kinds = [
        (LedgerStatus.TRAINED, ""),
        (LedgerStatus.DROPPED, "stale: lag 6 > max_lag 4"),
        (LedgerStatus.TRAINED, ""),
        (LedgerStatus.MASKED, "sandbox_error: no result after 3 attempts"),
    ]
    ledger = [
        LedgerEntry(
            trajectory_id=t.id,
            group_id=t.group_id,
            status=kinds[i % 4][0],
            reason=kinds[i % 4][1],
            writer="learner-test",
        )
        for i, t in enumerate(trajs)
    ]
    return trajs, scored, ledger


def records(
    settings: Settings, spec: topics.TopicSpec, msgs: list[Message]
) -> list[tuple[str, bytes | None, bytes]]:
    name = spec.full_name(settings.topics.prefix)
    return [(name, topics.key_for(spec, m), codec.encode(m)) for m in msgs]


async def publish_run(
    run: Settings,
    trajs: list[Trajectory],
    scored: list[ScoredTrajectory],
    ledger: list[LedgerEntry],
) -> None:
    """The run's topics as the services would leave them; the learner's group committed
    past every reward (it has read them all)."""
    await produce(
        run,
        records(run, topics.TRAJECTORIES, trajs)
        + records(run, topics.REWARDS, scored)
        + records(run, topics.LEDGER, ledger),
    )
    rewards = topics.REWARDS.full_name(run.topics.prefix)
    group = f"{run.topics.prefix}.learner.default"
    await commit_group(run, group, rewards, await end_offsets(run, rewards))
