"""The reward dispatcher on the real stack: Kafka, Redis, the sandbox worker and Docker.

The dispatcher and the sandbox worker run as `rollstream` processes, as in production.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from schemas import codec, topics
from schemas.learning import LedgerEntry
from schemas.messages import ScoredTrajectory, Task, Trajectory
from schemas.sandbox import Outcome
from services import topics as topic_admin
from services.settings import Settings
from streams import groups

from .dispatch_helpers import (
    BAD,
    GOOD,
    HALF,
    Service,
    consume,
    group_of,
    produce,
    service_env,
    with_prefix,
)
from .dispatch_helpers import topic as topic_of

SANDBOX_MIX = [GOOD, GOOD, HALF, BAD, GOOD, HALF, BAD, BAD]
"""Per group of 8: known outcomes (2/2, 1/2, 0/2 tests passed)."""
EXPECTED_PASSED = {GOOD: 2, HALF: 1, BAD: 0}


@pytest.fixture
async def run(settings: Settings, prefix: str, tmp_path: Path, _stack_up: None):  # type: ignore[no-untyped-def]
    run_settings = with_prefix(settings, prefix)
    await topic_admin.ensure(run_settings)
    services: list[Service] = []

    def start(*args: str, **env: str) -> Service:
        svc = Service(list(args), service_env(prefix, **env), tmp_path / f"{args[0]}.log").start()
        services.append(svc)
        return svc

    yield run_settings, start
    for svc in services:
        svc.stop()
    for log, svc in {svc.log: svc for svc in services}.items():  # shown only on failure
        print(f"--- {log.name} ---\n{svc.tail()}")


def sandbox_groups(n_groups: int, tag: str) -> list[Trajectory]:
    out: list[Trajectory] = []
    for g in range(n_groups):
        out += group_of(f"task-{g % 7}", f"{tag}-{g}", SANDBOX_MIX, sandbox=True)
    return out


def inline_groups(n_groups: int, tag: str) -> list[Trajectory]:
    out: list[Trajectory] = []
    for g in range(n_groups):
        answers = ["42", "41", "42", "x", "42", "42", "", "4 2"]
        out += group_of(f"inline-{g % 5}", f"{tag}-i{g}", answers, sandbox=False)
    return out


def records(settings: Settings, trajs: list[Trajectory]) -> list[tuple[str, bytes, bytes]]:
    name = topic_of(settings, topics.TRAJECTORIES)
    return [(name, t.group_id.encode(), codec.encode(t)) for t in trajs]


def check_rewards(
    trajs: list[Trajectory], rewards: list[ScoredTrajectory], redelivered: bool = False
) -> None:
    """Exactly one reward per trajectory; reward and advantage as the pure functions say.
    With `redelivered` (after a crash) a reward may appear twice on the topic, but then as
    the very same message (same id, reward, advantage): one reward per trajectory by id."""
    sent = {t.id: t for t in trajs}
    if redelivered:
        first: dict[str, ScoredTrajectory] = {}
        for r in rewards:
            seen = first.setdefault(r.id, r)
            assert (seen.trajectory.id, seen.reward, seen.advantage, seen.outcome) == (
                r.trajectory.id,
                r.reward,
                r.advantage,
                r.outcome,
            ), "a redelivered reward differs from the first"
        rewards = list(first.values())
    counts = Counter(r.trajectory.id for r in rewards)
    assert len(rewards) == len(trajs), f"{len(rewards)} rewards for {len(trajs)} trajectories"
    assert set(counts) == set(sent) and max(counts.values()) == 1
    by_group: dict[str, list[ScoredTrajectory]] = defaultdict(list)
    for r in rewards:
        by_group[r.group_id].append(r)
        assert not r.masked, r.mask_reason
        assert r.trajectory.completion == sent[r.trajectory.id].completion
        if r.trajectory.verifier.needs_sandbox:
            passed = EXPECTED_PASSED[r.trajectory.completion]
            assert (r.passed, r.total) == (passed, 2), r
            assert r.outcome == (Outcome.PASSED if passed == 2 else Outcome.FAILED)
            assert r.reward == pytest.approx(passed / 2)
            assert r.image_digest and r.verifier_name == "python_tests"
        else:
            assert r.reward == (1.0 if r.trajectory.completion == "42" else 0.0)
    for members in by_group.values():
        members.sort(key=lambda r: r.trajectory.id)
        expected = groups.group_advantages([r.reward for r in members])
        assert [r.advantage for r in members] == pytest.approx(expected)
        assert {r.group_size_scored for r in members} == {8}


async def test_thousand_trajectories_scored_exactly(run) -> None:  # type: ignore[no-untyped-def]
    """1,000 trajectories in 125 groups of 8 with known code -> exactly 1,000 right rewards."""
    settings, start = run
    trajs = sandbox_groups(125, "g")
    random.Random(7).shuffle(trajs)
    start("sandbox-worker")
    start("dispatcher")
    await produce(settings, records(settings, trajs))
    rewards = await consume(
        settings, topic_of(settings, topics.REWARDS), ScoredTrajectory, 1000, 420, settle_s=3
    )
    check_rewards(trajs, rewards)  # type: ignore[arg-type]
    dlq = await consume(settings, topic_of(settings, topics.DLQ), None, 1, 3)
    assert dlq == []


def malformed(settings: Settings, n: int) -> list[tuple[str, bytes | None, bytes]]:
    """Bad records of many kinds, as outside producers might write them."""
    name = topic_of(settings, topics.TRAJECTORIES)
    good = group_of("t", "bad-g", ["42"], sandbox=False)[0]
    raw = codec.encode(good)
    task = Task(task_id="t", suite="s", prompt="p", verifier=good.verifier, group_size=1)
    kinds: list[tuple[bytes | None, bytes]] = [
        (b"k", b"\x00\x01garbage"),
        (b"k", b""),
        (good.group_id.encode(), raw[: len(raw) // 2]),  # truncated
        (b"k", codec.encode(task)),  # a valid message of the wrong schema
        (b"wrong-key", raw),  # valid message on the wrong key (would split its group)
        (None, raw),
        (b"k", b"\x81\xa6schema\xaaTrajectory"),  # the right schema, nothing else
        (b"k", raw[:-3] + b"\xc1\xc1\xc1"),  # a byte MessagePack never uses
    ]
    return [(name, *kinds[i % len(kinds)]) for i in range(n)]


async def test_malformed_records_go_to_dlq_and_valid_ones_are_scored(run) -> None:  # type: ignore[no-untyped-def]
    settings, start = run
    trajs = inline_groups(40, "m") + sandbox_groups(5, "m")
    bad = malformed(settings, 19)  # 5% of 379
    mixed = records(settings, trajs) + bad
    random.Random(3).shuffle(mixed)
    start("sandbox-worker")
    dispatcher = start("dispatcher")
    pid = dispatcher.proc.pid if dispatcher.proc else None
    await produce(settings, mixed)
    rewards = await consume(
        settings, topic_of(settings, topics.REWARDS), ScoredTrajectory, len(trajs), 240, 3
    )
    check_rewards(trajs, rewards)  # type: ignore[arg-type]
    letters = await consume(settings, topic_of(settings, topics.DLQ), None, len(bad), 30, 2)
    assert len(letters) == len(bad)
    originals = Counter(letter.original for letter in letters)  # type: ignore[attr-defined]
    assert originals == Counter(v for _, _, v in bad)
    for letter in letters:
        assert letter.reason and letter.source_topic == topic_of(settings, topics.TRAJECTORIES)  # type: ignore[attr-defined]
    assert dispatcher.alive() and dispatcher.proc and dispatcher.proc.pid == pid


async def test_sigkill_mid_run_still_one_reward_each(run) -> None:  # type: ignore[no-untyped-def]
    settings, start = run
    trajs = inline_groups(150, "k") + sandbox_groups(10, "k")
    random.Random(11).shuffle(trajs)
    start("sandbox-worker")
    first = start("dispatcher")
    await produce(settings, records(settings, trajs))
    # Wait until the dispatcher is mid-way, then kill it without warning.
    partial = await consume(
        settings, topic_of(settings, topics.REWARDS), ScoredTrajectory, len(trajs) // 4, 120
    )
    assert 0 < len(partial) < len(trajs), "the kill must land mid-run"
    first.kill()
    start("dispatcher")
    rewards = await consume(
        settings, topic_of(settings, topics.REWARDS), ScoredTrajectory, len(trajs), 300, 5
    )
    # Read until every trajectory has its reward (duplicates are possible after the kill).
    deadline = time.monotonic() + 300
    while len({r.id for r in rewards}) < len(trajs) and time.monotonic() < deadline:
        rewards = await consume(
            settings, topic_of(settings, topics.REWARDS), ScoredTrajectory, len(rewards) + 1, 10
        )
    check_rewards(trajs, rewards, redelivered=True)  # type: ignore[arg-type]
    print(f"after SIGKILL: {len(rewards) - len(trajs)} redelivered reward records")
    ledger = await consume(settings, topic_of(settings, topics.LEDGER), LedgerEntry, 0, 2)
    assert ledger == []  # nothing dropped


async def test_deadline_masks_when_no_sandbox_answers(run) -> None:  # type: ignore[no-untyped-def]
    """No sandbox worker: requests are retried at the deadline, then the samples are masked
    (an infrastructure failure is never turned into a reward)."""
    settings, start = run
    trajs = group_of("t", "lonely", [GOOD, BAD], sandbox=True)
    start(
        "dispatcher",
        ROLLSTREAM__DISPATCHER__REQUEST_DEADLINE_S="1",
        ROLLSTREAM__DISPATCHER__MAX_ATTEMPTS="2",
        ROLLSTREAM__DISPATCHER__TICK_INTERVAL_S="0.2",
    )
    t0 = time.monotonic()
    await produce(settings, records(settings, trajs))
    rewards = await consume(settings, topic_of(settings, topics.REWARDS), ScoredTrajectory, 2, 60)
    assert len(rewards) == 2 and time.monotonic() - t0 < 60
    assert all(r.masked and r.outcome == Outcome.SANDBOX_ERROR for r in rewards)  # type: ignore[attr-defined]
    requests = await consume(settings, topic_of(settings, topics.SANDBOX_REQUESTS), None, 4, 5)
    assert sorted((r.trajectory_id, r.attempt) for r in requests) == sorted(  # type: ignore[attr-defined]
        (t.id, a) for t in trajs for a in (0, 1)
    )
    await asyncio.sleep(0)
