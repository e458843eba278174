"""`rollstream status --once` against every consumer group a demo-shaped run creates: the
generators', the sandbox workers', the learner's (plain aiokafka groups) and the
dispatcher's (faust's own group protocol), live and after the run. aiokafka 0.14 misreads
a DescribeGroups answer for several groups against Kafka 4.x ("Buffer underrun decoding
string"); status describes groups one by one and shows what it cannot read as unknown."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from schemas import topics
from schemas.rollout import ScoredTrajectory
from services import kafka
from services import topics as topic_admin
from services.settings import Settings

from .dispatch_helpers import Service, consume, group_of, produce, service_env, with_prefix
from .ops_helpers import records
from .test_status import cli

PLAIN = (topics.GENERATORS, topics.SANDBOX_WORKERS, topics.LEARNER)


async def _join(run: Settings) -> list[object]:
    """One live member in each plain group, subscribed to what that group consumes."""
    members = []
    for g in PLAIN:
        names = [kafka.topic(run, spec) for spec in g.consumes]
        c = kafka.consumer(run, "status-test", *names, group_id=kafka.group(run, g, "default"))
        await c.start()
        await c.getmany(timeout_ms=2000)
        await c.commit()  # committed offsets keep the group listed once it is empty
        members.append(c)
    return members


def _groups(prefix: str) -> dict[str, dict[str, object]]:
    code, out = cli("status", "--prefix", prefix, "--json")
    assert code == 0, out
    return {g["group"]: g for g in json.loads(out)["groups"]}


async def test_status_once_reads_every_group_of_a_run(
    settings: Settings, prefix: str, tmp_path: Path, _stack_up: None
) -> None:
    run = with_prefix(settings, prefix)
    await topic_admin.ensure(run)
    trajs = group_of("t", "g0", ["42", "41", "42", "x"], sandbox=False)
    dispatcher = Service(["dispatcher"], service_env(prefix), tmp_path / "d.log").start()
    members = await _join(run)
    try:
        await produce(run, records(run, topics.TRAJECTORIES, list(trajs)))
        rewards = kafka.topic(run, topics.REWARDS)
        assert len(await consume(run, rewards, ScoredTrajectory, 4, 180)) == 4
        live = await asyncio.to_thread(_groups, prefix)
        code, out = await asyncio.to_thread(cli, "status", "--prefix", prefix, "--once")
        assert code == 0, out
    finally:
        for c in members:
            await c.stop()  # type: ignore[attr-defined]
        dispatcher.stop()
    want = {kafka.group(run, g, "default") for g in (*PLAIN, topics.DISPATCHER)}
    assert want <= set(live), (want, live)
    assert live[kafka.group(run, topics.DISPATCHER)]["members"] == 1, live
    for g in PLAIN:
        assert live[kafka.group(run, g, "default")]["members"] == 1, live

    code, out = await asyncio.to_thread(cli, "status", "--prefix", prefix, "--once")
    assert code == 0, out
    assert kafka.group(run, topics.DISPATCHER) in out
    after = await asyncio.to_thread(_groups, prefix)
    assert want <= set(after) and all(after[g]["members"] == 0 for g in want), after
