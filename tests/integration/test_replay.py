"""Replay and export on the real stack, with the reward dispatcher running as a process.

One run publishes two batches of trajectories (in-process `math_answer` verifier), the
second after a known instant. Then: a dry run counts the window; a replay of that time
window is scored again with lineage to the originals; an export of the topic replayed
from the file under a stricter verifier (`exact`) changes the rewards as expected; and a
replay of the rewards under another reward map re-scores without running anything.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import defaultdict
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from schemas import codec, topics
from schemas.envelope import Origin
from schemas.messages import ScoredTrajectory, Trajectory, VerifierSpec
from services import cli_ops, kafka_read, logfiles
from services import topics as topic_admin
from services.export import export
from services.replay import FileSource, TopicSource, replay
from services.settings import RewardsSettings, Settings

from .dispatch_helpers import Service, produce, service_env, with_prefix
from .ops_helpers import read_all, require_kafka_redis, wait_for

MATH = VerifierSpec(name="math_answer", answer="42", needs_sandbox=False)
ANSWERS = ["42", "42.0", "\\boxed{42}", "41"]
"""math_answer passes the first three; exact "42" only the first."""


def batch(tag: str, n_groups: int) -> list[Trajectory]:
    return [
        Trajectory(
            task_id=f"task-{g}",
            group_id=f"{tag}-{g}",
            group_size=len(ANSWERS),
            index=i,
            verifier=MATH,
            completion=answer,
        )
        for g in range(n_groups)
        for i, answer in enumerate(ANSWERS)
    ]


async def publish(settings: Settings, trajs: list[Trajectory]) -> None:
    name = topics.TRAJECTORIES.full_name(settings.topics.prefix)
    await produce(settings, [(name, t.group_id.encode(), codec.encode(t)) for t in trajs])


async def rewards_of(settings: Settings, want: int) -> dict[str, ScoredTrajectory]:
    """Every reward of the run by trajectory id, once there are `want`; never two rewards
    for one trajectory."""
    found = await wait_for(settings, topics.REWARDS, ScoredTrajectory, want)
    out = {r.trajectory.id: r for r in found}
    assert len(out) == len(found), "a trajectory was scored twice"
    return out


def expected(answer: str, strict: bool) -> float:
    if strict:
        return 1.0 if answer == "42" else 0.0
    return 0.0 if answer == "41" else 1.0


@pytest.fixture
def run(settings: Settings, prefix: str, tmp_path: Path):  # type: ignore[no-untyped-def]
    require_kafka_redis(settings)
    run_settings = with_prefix(settings, prefix)
    asyncio.run(topic_admin.ensure(run_settings))
    env = service_env(prefix, ROLLSTREAM__STACK__STATE_DIR=str(tmp_path / "state"))
    dispatcher = Service(["dispatcher"], env, tmp_path / "dispatcher.log").start()
    yield run_settings
    dispatcher.stop()


async def test_replay_window_file_and_rescoring(run: Settings, tmp_path: Path) -> None:
    settings = run
    old, new = batch("old", 2), batch("new", 2)
    await publish(settings, old)
    await asyncio.sleep(1.5)  # record timestamps are milliseconds: keep the batches apart
    since_ms = round(time.time() * 1000)
    await publish(settings, new)
    originals = await rewards_of(settings, len(old) + len(new))
    for t in old + new:
        assert originals[t.id].reward == expected(t.completion, strict=False)
    until_ms = round(time.time() * 1000) + 1

    # dry run: the window holds exactly the second batch; nothing is published
    window = TopicSource(
        settings.topics.prefix, "trajectories", kafka_read.Selection(since_ms=since_ms)
    )
    dry = await replay(settings, window, dry_run=True)
    assert (dry.trajectories, dry.groups, dry.published) == (len(new), 2, 0)

    # replay of the time window: scored again, with lineage to the originals
    report = await replay(settings, window)
    assert report.published == len(new) and set(report.parents.values()) == {t.id for t in new}
    everything = await rewards_of(settings, len(old) + 2 * len(new))
    replayed = {tid: r for tid, r in everything.items() if tid in report.parents}
    assert len(replayed) == len(new)
    for tid, r in replayed.items():
        parent = originals[report.parents[tid]]
        assert (
            r.trajectory.origin is Origin.REPLAY and r.trajectory.parent_id == parent.trajectory.id
        )
        assert r.reward == parent.reward and r.trajectory.completion == parent.trajectory.completion
        assert r.trajectory.group_id.startswith(parent.trajectory.group_id + "~")

    # export of the original run, replayed from the file under a stricter verifier
    out = tmp_path / "run.jsonl"
    exported = await export(settings, "trajectories", out, kafka_read.Selection(until_ms=until_ms))
    assert exported.written == len(old) + len(new)
    assert {e.message.id for e in logfiles.read_file(out)} == {t.id for t in old + new}
    strict = await replay(settings, FileSource((out,)), verifier={"name": "exact", "answer": "42"})
    assert strict.published == len(old) + len(new)
    everything = await rewards_of(settings, 2 * (len(old) + len(new)) + len(new))
    rescored = [r for tid, r in everything.items() if tid in strict.parents]
    assert len(rescored) == len(old) + len(new)
    changed = 0
    for r in rescored:
        parent = originals[strict.parents[r.trajectory.id]]
        assert r.trajectory.verifier.name == "exact" and r.verifier_name == "exact"
        assert r.reward == expected(r.trajectory.completion, strict=True)
        changed += r.reward != parent.reward
    assert changed == 2 * (len(old) + len(new)) // len(ANSWERS)  # "42.0" and "\boxed{42}"

    # re-scoring the original rewards under another reward map: nothing runs again
    await check_reward_map_replay(settings, originals, until_ms, len(everything))


async def check_reward_map_replay(
    settings: Settings, originals: dict[str, ScoredTrajectory], until_ms: int, before: int
) -> None:
    selection = kafka_read.Selection(until_ms=until_ms)  # the original run's rewards
    source = TopicSource(settings.topics.prefix, "rewards", selection)
    report = await replay(settings, source, reward_map=RewardsSettings(passed=2.0))
    assert report.published == report.trajectories == len(originals)
    after = await rewards_of(settings, before + report.published)
    by_group: dict[str, list[ScoredTrajectory]] = defaultdict(list)
    for tid, parent_id in report.parents.items():
        r, parent = after[tid], originals[parent_id]
        assert r.reward == (2.0 if parent.reward == 1.0 else 0.0)
        assert r.outcome == parent.outcome and r.trajectory.parent_id == parent_id
        by_group[r.group_id].append(r)
    for members in by_group.values():  # 3 of 4 pass: advantages as the dispatcher computes
        assert len(members) == len(ANSWERS)
        assert sorted(round(m.advantage, 4) for m in members) == [-1.7321, 0.5774, 0.5774, 0.5774]


def test_cli_export_and_dry_run_replay(settings: Settings, prefix: str, tmp_path: Path) -> None:
    """The commands as an operator types them: export a topic to each format, count a
    replay of the files and of a topic range, and refuse what cannot work."""
    require_kafka_redis(settings)
    run = with_prefix(settings, prefix)
    asyncio.run(topic_admin.ensure(run))
    trajs = batch("cli", 3)
    asyncio.run(publish(run, trajs))
    app = typer.Typer()
    cli_ops.register(app)

    def cli(*args: str) -> tuple[int, str]:
        result = CliRunner().invoke(app, [*args, "--prefix", prefix])
        return result.exit_code, result.output

    for name in ("a.jsonl", "a.msgpack", "a.jsonl.gz"):
        code, out = cli("export", str(tmp_path / name), "--topic", "trajectories", "--json")
        assert code == 0 and json.loads(out)["written"] == len(trajs), out
        code, out = cli("replay", "--file", str(tmp_path / name), "--dry-run", "--json")
        report = json.loads(out)
        assert code == 0 and (report["trajectories"], report["groups"]) == (len(trajs), 3)
        assert report["published"] == 0
    code, out = cli("replay", "--start-offset", "0", "--end-offset", "2", "--dry-run", "--json")
    assert code == 0 and 0 < json.loads(out)["trajectories"] <= 2 * run.topics.partitions
    code, out = cli("replay", "--topic", "trajectories", "--reward", "passed=2", "--dry-run")
    assert code == 0 and "no verdict to re-score" in out
    code, out = cli("replay", "--since", "yesterday", "--dry-run")
    assert code == 2 and "ISO 8601" in out
    code, out = cli("export", str(tmp_path / "a.csv"))
    assert code == 2 and "--format" in out
    code, out = cli("export", str(tmp_path / "a.parquet"))
    try:
        import pyarrow.parquet as pq
    except ImportError:  # Parquet is optional: the refusal says what to install
        assert code == 2 and "pip install pyarrow" in out
        assert not (tmp_path / "a.parquet").exists()
    else:
        table = pq.read_table(tmp_path / "a.parquet")
        assert code == 0 and sorted(table.column("id").to_pylist()) == sorted(t.id for t in trajs)
    held = asyncio.run(read_all(run, topics.TRAJECTORIES, Trajectory))
    assert sorted(t.id for t in held) == sorted(t.id for t in trajs)  # nothing replayed
