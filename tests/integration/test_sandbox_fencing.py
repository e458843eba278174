"""Sandbox worker fencing (issue 16): a worker paused past its session timeout while its
partitions moved to another worker cannot commit: its results never reach read_committed
readers (the dispatcher) and its offsets are not committed. Worker ids are unique per
process by default (two workers on one host never fence each other)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from sandbox_workers import pooled
from sandbox_workers.config import SandboxSettings
from sandbox_workers.ports import Fenced, Publish
from schemas import topics
from services import kafka, kafka_read
from services import topics as topic_admin
from services.sandbox_wiring import KafkaWorkerIO
from services.settings import Settings

from .dispatch_helpers import produce, with_prefix


async def _revoked(_: list[tuple[str, int]]) -> None:
    return None


async def _fetch_some(io: KafkaWorkerIO, want: int) -> list[Any]:
    got: list[Any] = []
    for _ in range(60):  # bounded: 30 s
        got += await io.fetch(100, 500)
        if len(got) >= want:
            break
    return got


async def _assigned_all(io: KafkaWorkerIO, n: int) -> bool:
    for _ in range(80):  # bounded: 40 s
        await io.fetch(100, 500)
        if len(io.consumer.assignment()) == n:
            return True
    return False


def test_worker_ids_are_unique_per_process_by_default() -> None:
    section = SandboxSettings()
    assert pooled.worker_id(section) != pooled.worker_id(section)
    assert pooled.worker_id(section, "given") == "given"


async def test_a_fenced_workers_results_are_ignored(
    settings: Settings, prefix: str, _stack_up: None
) -> None:
    run = with_prefix(settings, prefix)
    await topic_admin.ensure(run)
    requests = kafka.topic(run, topics.SANDBOX_REQUESTS)
    n_parts = len(await kafka.partitions(run, requests))
    await produce(run, [(requests, f"k{i}".encode(), b"request") for i in range(8)])
    zombie, successor = KafkaWorkerIO(run, "zombie"), KafkaWorkerIO(run, "successor")
    async with zombie.session(_revoked):
        fetched = await _fetch_some(zombie, 8)
        assert len(fetched) == 8
        # the zombie is paused: its heartbeats stop, its session times out
        coordinator = zombie.consumer._coordinator

        async def paused() -> bool:
            return True

        coordinator._do_heartbeat = paused
        async with successor.session(_revoked):
            assert await _assigned_all(successor, n_parts), "the successor got no partitions"
            offsets = {(r.topic, r.partition): r.offset + 1 for r in fetched}
            with pytest.raises(Fenced, match="no longer current"):
                await zombie.publish([Publish(b"k", b"zombie result")], offsets)
            await successor.publish([Publish(b"k", b"successor result")], offsets)
    results = kafka.topic(run, topics.SANDBOX_RESULTS)
    values = [r.value for r in await kafka_read.read_topic(run, results)]
    assert values == [b"successor result"]
    admin = kafka.admin(run)
    await admin.start()
    try:
        committed = await asyncio.wait_for(
            admin.list_consumer_group_offsets(kafka.group(run, topics.SANDBOX_WORKERS)), 30
        )
    finally:
        await admin.close()
    assert {(tp.topic, tp.partition): m.offset for tp, m in committed.items()} == offsets
