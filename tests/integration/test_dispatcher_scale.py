"""The reward dispatcher across restarts and scale-out, on the real stack (issue 13):

- a backlog on trajectories and on sandbox results, then a dispatcher restart: exactly
  one `{tid}:scored` per trajectory, no request retried (attempt > 0), audit clean;
- 1 -> 2 -> 1 dispatcher processes with a SIGKILL in between: one reward per trajectory,
  audit clean, no tick records while idle. The default suite runs it over 800
  trajectories; the soak-marked version over 5,000.
"""

from __future__ import annotations

import asyncio
import random
from collections import defaultdict

import pytest

from schemas import topics
from schemas.messages import ScoredTrajectory, Trajectory
from services import audit
from services.settings import Settings

from .dispatch_helpers import consume
from .dispatch_helpers import topic as topic_of
from .test_dispatcher import check_rewards, inline_groups, records, run, sandbox_groups

__all__ = ["run"]  # the fixture


def shuffled(trajs: list[Trajectory], seed: int) -> list[Trajectory]:
    random.Random(seed).shuffle(trajs)
    return trajs


async def rewards_until(settings: Settings, n: int, timeout_s: float) -> list[ScoredTrajectory]:
    """Every reward record until n distinct ids are seen (duplicates kept), or timeout."""
    name = topic_of(settings, topics.REWARDS)
    got: list[ScoredTrajectory] = []
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while loop.time() < deadline:
        got = await consume(settings, name, ScoredTrajectory, max(n, len(got) + 1), 20, 2)  # type: ignore[assignment]
        if len({r.id for r in got}) >= n:
            break
    return got


def one_scored_id_each(trajs: list[Trajectory], rewards: list[ScoredTrajectory]) -> None:
    ids: dict[str, set[str]] = defaultdict(set)
    for r in rewards:
        ids[r.trajectory.id].add(r.id)
    assert {tid: len(s) for tid, s in ids.items()} == {t.id: 1 for t in trajs}
    assert all(s == {f"{tid}:scored"} for tid, s in ids.items())


async def audit_clean(settings: Settings) -> None:
    rep = await audit.audit(settings)
    assert rep.ok, rep.to_json()
    assert rep.unaccounted == 0 and not rep.conflicts and rep.published == rep.scored


@pytest.mark.timeout(1500)
async def test_backlog_on_both_topics_then_restart(run) -> None:  # type: ignore[no-untyped-def]
    settings, start = run
    early = shuffled(sandbox_groups(6, "b1") + inline_groups(10, "b1"), 5)
    late = shuffled(sandbox_groups(6, "b2") + inline_groups(10, "b2"), 6)
    trajs = early + late
    start("sandbox-worker")
    first = start("dispatcher")
    await produce_all(settings, early)
    # Wait until the sandbox tier answers (its warm pool can take minutes on a busy box).
    name = topic_of(settings, topics.REWARDS)
    partial: list[ScoredTrajectory] = []
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 600
    while not any(r.trajectory.verifier.needs_sandbox for r in partial):
        assert loop.time() < deadline, "no sandbox result in 10 minutes"
        partial = await consume(settings, name, ScoredTrajectory, len(partial) + 1, 20)  # type: ignore[assignment]
    first.stop()
    # While it is down: more trajectories, and the worker keeps publishing results.
    await produce_all(settings, late)
    await asyncio.sleep(8)
    start("dispatcher")
    rewards = await rewards_until(settings, len(trajs), 300)
    check_rewards(trajs, rewards, redelivered=True)
    one_scored_id_each(trajs, rewards)
    n_sandbox = sum(t.verifier.needs_sandbox for t in trajs)
    name = topic_of(settings, topics.SANDBOX_REQUESTS)
    requests = await consume(settings, name, None, n_sandbox, 30, settle_s=2)
    assert len({r.trajectory_id for r in requests}) == n_sandbox  # type: ignore[attr-defined]
    assert all(r.attempt == 0 for r in requests), "a request was retried"  # type: ignore[attr-defined]
    await audit_clean(settings)


async def produce_all(settings: Settings, trajs: list[Trajectory]) -> None:
    from .dispatch_helpers import produce

    await produce(settings, records(settings, trajs))


async def scale_out(run, n_groups: int) -> None:  # type: ignore[no-untyped-def]
    """1 dispatcher, then 2 (a rebalance), then SIGKILL one (its partitions move)."""
    settings, start = run
    thirds = [shuffled(inline_groups(n_groups // 3, f"s{i}"), i) for i in range(3)]
    trajs = [t for part in thirds for t in part]
    third = len(thirds[0])
    a = start("dispatcher")
    await produce_all(settings, thirds[0])
    await consume(settings, topic_of(settings, topics.REWARDS), ScoredTrajectory, third // 2, 180)
    b = start("dispatcher")
    await produce_all(settings, thirds[1])
    await consume(settings, topic_of(settings, topics.REWARDS), ScoredTrajectory, third, 180)
    a.kill()
    await produce_all(settings, thirds[2])
    rewards = await rewards_until(settings, len(trajs), 600)
    assert b.alive()
    check_rewards(trajs, rewards, redelivered=True)
    one_scored_id_each(trajs, rewards)
    await audit_clean(settings)
    # Idle: everything emitted, nothing due for an hour (the tombstone TTL): no ticks.
    ticks = f"{topics.DISPATCHER.full_id(settings.topics.prefix)}-ticks"
    before = await tick_count(settings, ticks)
    await asyncio.sleep(6)
    assert await tick_count(settings, ticks) == before, "ticks while idle"


async def tick_count(settings: Settings, name: str) -> int:
    from services import kafka

    client = kafka.consumer(settings, "test-tick-count")
    await client.start()
    try:
        return await kafka.record_count(settings, client, name)
    finally:
        await client.stop()


@pytest.mark.timeout(900)
async def test_scale_out_one_two_one_with_sigkill(run) -> None:  # type: ignore[no-untyped-def]
    await scale_out(run, 102)


@pytest.mark.soak
@pytest.mark.timeout(1800)
async def test_scale_out_soak_5000(run) -> None:  # type: ignore[no-untyped-def]
    await scale_out(run, 627)
