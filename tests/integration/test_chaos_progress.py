"""The chaos run's progress signal (services/chaos_stack.py) on the real Kafka: a record of
an aborted transaction moves the end offsets, yet is not progress; a committed one is."""

from __future__ import annotations

import asyncio
from pathlib import Path

from schemas import topics
from services import kafka
from services import topics as topic_admin
from services.chaos_stack import ChaosStack
from services.settings import Settings

from .dispatch_helpers import with_prefix


async def test_aborted_records_are_not_progress_committed_ones_are(
    settings: Settings, prefix: str, tmp_path: Path, _stack_up: None
) -> None:
    run = with_prefix(settings, prefix)
    await topic_admin.ensure(run)
    stack = ChaosStack(run, None, tmp_path)  # type: ignore[arg-type]
    spec, name = topics.SANDBOX_RESULTS, kafka.topic(run, topics.SANDBOX_RESULTS)
    producer = kafka.producer(run, "chaos-test", transactional_id=f"{prefix}.chaos-test")
    await producer.start()
    try:
        base = (await stack.ends([spec]))[spec]
        await producer.begin_transaction()
        await producer.send_and_wait(name, b"aborted", key=b"k")
        await producer.abort_transaction()
        for _ in range(50):  # the abort marker is written after abort returns: 5 s at most
            moved = (await stack.ends([spec]))[spec]
            if sum(moved.values()) > sum(base.values()):
                break
            await asyncio.sleep(0.1)
        assert sum(moved.values()) > sum(base.values()), "the abort moves the end offsets"
        assert not await stack.arrived(spec, base, 2.0)
        async with producer.transaction():
            await producer.send_and_wait(name, b"committed", key=b"k")
        assert await stack.arrived(spec, base, 10.0)
    finally:
        await producer.stop()
        if stack.counter is not None:
            await stack.counter.stop()
