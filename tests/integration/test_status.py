"""`rollstream status` on topics the test writes itself: lag of the learner's group,
throughput, the learner's version and step, staleness, reward trend and the DLQ count,
as JSON, as a one-off view and as a bounded live view."""

from __future__ import annotations

import asyncio
import json

import typer
from typer.testing import CliRunner

from schemas import topics
from schemas.learning import WeightUpdate
from schemas.transport import DeadLetter
from services import cli_ops
from services import topics as topic_admin
from services.settings import Settings

from .dispatch_helpers import produce, with_prefix
from .ops_helpers import commit_group, end_offsets, records, require_kafka_redis, run_content

SHA = "0" * 64


def cli(*args: str) -> tuple[int, str]:
    app = typer.Typer()
    cli_ops.register(app)
    result = CliRunner().invoke(app, list(args), terminal_width=160)
    return result.exit_code, result.output


async def _publish(run: Settings) -> None:
    trajs, scored, ledger = run_content(5, policy_version=1)
    announce = WeightUpdate(
        policy="default",
        version=3,
        step=30,
        uri="file:///w/3",
        sha256=SHA,
        size_bytes=10,
        samples_consumed=6,
    )
    letter = DeadLetter(
        reason="bad",
        source_topic="x",
        source_partition=0,
        source_offset=0,
        original=b"?",
        original_size=1,
        original_sha256=SHA,
        consumer="t",
    )
    await produce(
        run,
        records(run, topics.TRAJECTORIES, trajs)
        + records(run, topics.REWARDS, scored)
        + records(run, topics.LEDGER, ledger[:6])
        + records(run, topics.WEIGHTS, [announce])
        + records(run, topics.DLQ, [letter, letter]),
    )
    # the learner's group has read 4 of the 10 rewards (all on whichever partitions)
    rewards = topics.REWARDS.full_name(run.topics.prefix)
    committed, left = {}, 4
    for partition, end in sorted((await end_offsets(run, rewards)).items()):
        committed[partition] = min(left, end)
        left -= committed[partition]
    await commit_group(run, f"{run.topics.prefix}.learner.default", rewards, committed)


def test_status_shows_the_run(settings: Settings, prefix: str) -> None:
    require_kafka_redis(settings)
    run = with_prefix(settings, prefix)
    asyncio.run(topic_admin.ensure(run))
    asyncio.run(_publish(run))

    code, out = cli("status", "--prefix", prefix, "--json")
    assert code == 0, out
    snap = json.loads(out)
    assert snap["learner"] == {**snap["learner"], "version": 3, "step": 30, "samples_consumed": 6}
    assert snap["dlq"] == 2 and snap["topic_records"]["rewards"] == 10
    assert snap["throughput"]["rewards"] > 0  # written within the last minute
    assert snap["staleness"] == {"mean": 2.0, "max": 2.0, "n": 10}
    assert snap["reward_trend"] and all(0 <= r <= 1 for r in snap["reward_trend"])
    assert snap["outcomes"] == {"passed": 5, "failed": 5}
    [group] = [g for g in snap["groups"] if g["group"] == f"{prefix}.learner.default"]
    assert group["lag"] == {topics.REWARDS.full_name(prefix): 6}

    code, out = cli("status", "--prefix", prefix, "--once")
    assert code == 0 and "default v3 step 30" in out and f"{prefix}.learner.default" in out
    code, out = cli("status", "--prefix", prefix, "--count", "2", "--interval", "0.2")
    assert code == 0 and "v3 step 30" in out
