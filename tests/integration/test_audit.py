"""`rollstream audit` on topics whose content the test writes itself: a complete run has
zero unaccounted ids (exit 0); with one ledger entry held back, the audit names that id
(exit 1); in-flight and dead-lettered trajectories are told apart."""

from __future__ import annotations

import asyncio
import json

import typer
from typer.testing import CliRunner

from schemas import topics
from schemas.deadletter import publish_dead_letter
from schemas.rollout import Trajectory
from services import cli_ops
from services import topics as topic_admin
from services.settings import Settings

from .dispatch_helpers import produce, with_prefix
from .ops_helpers import VERIFIER, publish_run, records, require_kafka_redis, run_content


def cli(*args: str) -> tuple[int, str]:
    app = typer.Typer()
    cli_ops.register(app)
    result = CliRunner().invoke(app, list(args))
    return result.exit_code, result.output


def test_audit_accounts_for_every_trajectory_and_names_a_missing_one(
    settings: Settings, prefix: str
) -> None:
    require_kafka_redis(settings)
    run = with_prefix(settings, prefix)
    asyncio.run(topic_admin.ensure(run))
    trajs, scored, ledger = run_content(6)
    held_back = ledger[2]
    kept = [e for e in ledger if e is not held_back] + ledger[:1]  # the last: a re-sent one
    asyncio.run(publish_run(run, trajs, scored, kept))

    code, out = cli("audit", "--prefix", prefix, "--json")
    report = json.loads(out)
    assert code == 1 and not report["ok"]
    assert report["unaccounted_ids"] == [held_back.trajectory_id] and report["unaccounted"] == 1
    assert (report["published"], report["scored"], report["in_flight"]) == (12, 12, 0)
    assert report["dropped"] == {"stale": 3} and report["masked"] == {"sandbox_error": 3}
    assert report["trained"] == 5 and report["conflicts"] == {}

    asyncio.run(produce(run, records(run, topics.LEDGER, [held_back])))
    code, out = cli("audit", "--prefix", prefix)
    assert code == 0 and "OK" in out and "unaccounted        0" in out, out

    # a new trajectory not yet scored is in flight; the dispatcher's dead letter accounts
    # for a bad one; with --finished nothing is in flight any more
    pending = Trajectory(task_id="t", group_id="late", group_size=1, verifier=VERIFIER)
    bad = Trajectory(task_id="t", group_id="bad", group_size=1, verifier=VERIFIER)
    asyncio.run(produce(run, records(run, topics.TRAJECTORIES, [pending, bad])))
    asyncio.run(_dead_letter(run, bad))
    code, out = cli("audit", "--prefix", prefix, "--json")
    report = json.loads(out)
    assert code == 0 and report["in_flight"] == 1 and report["dead_lettered"] == 1
    code, out = cli("audit", "--prefix", prefix, "--json", "--finished")
    assert code == 1 and json.loads(out)["unaccounted_ids"] == [pending.id]


async def _dead_letter(run: Settings, bad: Trajectory) -> None:
    """Dead-letter the record of `bad` on trajectories, as the dispatcher would."""
    from aiokafka import AIOKafkaProducer

    from services import kafka_read

    name = topics.TRAJECTORIES.full_name(run.topics.prefix)
    [rec] = [r for r in await kafka_read.read_topic(run, name) if r.key == b"bad"]

    producer = AIOKafkaProducer(bootstrap_servers=run.kafka.endpoint)
    await producer.start()
    try:
        await publish_dead_letter(
            producer,
            topics.DLQ.full_name(run.topics.prefix),
            reason="key is not the group id",
            source_topic=name,
            partition=rec.partition,
            offset=rec.offset,
            key=rec.key,
            value=rec.value,
            consumer="dispatcher-test",
        )
    finally:
        await producer.stop()
