"""`rollstream up --brokers 3`: a local 3-node KRaft cluster of the test's own (own state dir
and ports), topics replicated 3 with min.insync.replicas 2, and acks=all produce/consume
through the SIGKILL of one broker. Torn down at the end (no JVM left)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from schemas import topics as registry
from services.kafka import consumer, producer, topic_partitions
from services.settings import Settings
from tests.integration import cluster_helpers as ch

pytestmark = pytest.mark.timeout(420)


async def _produce(settings: Settings, name: str, start: int, count: int) -> None:
    p = producer(settings, "test-cluster", request_timeout_ms=20000)
    await p.start()
    try:
        async with asyncio.timeout(90):
            sends = [
                await p.send(name, f"m{i}".encode(), key=f"k{i}".encode())
                for i in range(start, start + count)
            ]
            await asyncio.gather(*sends)
    finally:
        await p.stop()


async def _consume_all(settings: Settings, name: str) -> list[bytes]:
    c = consumer(settings, "test-cluster-read")
    await c.start()
    try:
        tps = await topic_partitions(settings, [name])
        c.assign(tps)
        await c.seek_to_beginning(*tps)
        ends = await c.end_offsets(tps)
        out: list[bytes] = []
        async with asyncio.timeout(90):
            while not all([await c.position(tp) >= ends[tp] for tp in tps]):
                batches = await c.getmany(timeout_ms=500)
                out += [r.value for rs in batches.values() for r in rs]
        return out
    finally:
        await c.stop()


def test_three_brokers_replicated_topics_survive_a_broker_kill(tmp_path: Path, prefix: str) -> None:
    state = tmp_path / "state"
    pairs = ch.cluster_pairs(state, prefix, ch.free_port_base())
    env, settings = ch.cluster_env(pairs), ch.cluster_settings(pairs)
    try:
        checks = {c["component"]: c for c in ch.up_json(env, "kafka,topics")}
        assert checks["kafka"]["healthy"], checks
        assert "3/3 broker(s)" in str(checks["kafka"]["detail"])
        assert checks["topics"]["healthy"], checks
        assert asyncio.run(ch.broker_ids(settings)) == [1, 2, 3]

        layout = asyncio.run(ch.topic_layout(settings))
        assert set(layout) == {s.full_name(prefix) for s in registry.ALL}
        assert set(layout.values()) == {(3, "2")}, layout

        doctor = ch.rollstream(env, "doctor", "--json", timeout=120)
        nodes = {c["component"]: c for c in json.loads(doctor.stdout)}
        assert all(nodes[f"kafka-{i}"]["healthy"] for i in (1, 2, 3)), nodes

        name = registry.TRAJECTORIES.full_name(prefix)
        asyncio.run(_produce(settings, name, 0, 200))
        ch.kill_node(state, 2)
        # acks=all with min.insync.replicas 2: writes go on with one broker of three down.
        asyncio.run(_produce(settings, name, 200, 200))
        values = asyncio.run(_consume_all(settings, name))
        assert sorted(values) == sorted(f"m{i}".encode() for i in range(400))

        sick = ch.rollstream(env, "doctor", "--json", timeout=120)
        lines = {c["component"]: c for c in json.loads(sick.stdout)}
        assert sick.returncode == 1
        assert not lines["kafka-2"]["healthy"] and lines["kafka-2"]["detail"] == "not running"
        assert lines["kafka-1"]["healthy"] and lines["kafka-3"]["healthy"]

        # `up` starts the dead node again; it rejoins and the cluster is whole.
        again = {c["component"]: c for c in ch.up_json(env, "kafka")}
        assert again["kafka"]["healthy"] and "started: 1 node(s)" in str(again["kafka"]["detail"])
        assert asyncio.run(ch.broker_ids(settings)) == [1, 2, 3]
    finally:
        ch.down_and_check(env, state)
