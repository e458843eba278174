"""Multi-turn episodes: each turn's code goes through the sandbox tier (a real sandbox
worker over sandbox.requests/results), the verdict is appended as an observation (masked
out of training, version -1), and the episode ends at the turn budget."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from schemas import codec, topics
from schemas.arrays import unpack_i32
from schemas.learning import WeightUpdate
from schemas.rollout import Trajectory
from services import kafka, suites
from services import topics as topic_admin
from services.rollout.generator import Generator
from services.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(240)


def run_settings(settings: Settings, prefix: str) -> Settings:
    return settings.model_copy(
        update={
            "topics": settings.topics.model_copy(update={"prefix": prefix}),
            "learner": settings.learner.model_copy(
                update={"tiny_dim": 32, "tiny_layers": 1, "tiny_heads": 2, "max_seq_len": 1024}
            ),
            "generator": settings.generator.model_copy(
                update={"pacing": False, "max_new_tokens": 12, "seed": 0, "turn_timeout_s": 60}
            ),
        }
    )


@contextlib.contextmanager
def sandbox_worker(prefix: str, log: Path):  # type: ignore[no-untyped-def]
    env = {
        **os.environ,
        "ROLLSTREAM__TOPICS__PREFIX": prefix,
        "ROLLSTREAM__SANDBOX__POOL_SIZE": "1",
    }
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "services.cli", "sandbox-worker", "--worker-id", f"{prefix}-w"],
            cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    try:
        yield proc
    finally:
        os.killpg(proc.pid, 15)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait(10)


async def test_multi_turn_episodes_through_the_sandbox(
    settings: Settings, prefix: str, tmp_path: Path, docker_client: object
) -> None:
    from learner.spec import make_policy
    from services.learner_service import weight_store

    s = run_settings(settings, prefix)
    await topic_admin.ensure(s)
    stored = weight_store(s).put(0, make_policy(s.learner).weights())
    update = WeightUpdate(
        policy=s.learner.policy, version=0, step=0, uri=stored.uri, sha256=stored.sha256,
        size_bytes=stored.size_bytes,
    )  # fmt: skip
    # code tasks: public feedback_tests drive the observations, hidden tests the reward
    tasks = suites.get("code", group_size=2, max_turns=3).tasks("train")[:3]
    producer = kafka.producer(s, "test-multiturn")
    await producer.start()
    try:
        await producer.send_and_wait(
            kafka.topic(s, topics.WEIGHTS), codec.encode(update), s.learner.policy.encode()
        )
        for t in tasks:
            await producer.send_and_wait(
                kafka.topic(s, topics.TASKS), codec.encode(t), t.task_id.encode()
            )
    finally:
        await producer.stop()
    with sandbox_worker(prefix, tmp_path / "worker.log"):
        gen = Generator(s, max_groups=len(tasks), idle_exit_s=60)
        started = time.monotonic()
        summary = await asyncio.wait_for(gen.run(), 180)
    assert summary.groups == 3 and summary.trajectories == 6, time.monotonic() - started
    trajs = await read_trajectories(s, 6)
    for t in trajs:
        check_episode(t)
    # a random policy fails: most episodes use every turn
    assert any(t.turns == 3 and t.finish_reason == "turn_limit" for t in trajs)
    no_hidden_test_shown(trajs)


def no_hidden_test_shown(trajs: list[Trajectory]) -> None:
    """No hidden test (nor its expected value) reaches a prompt or an observation."""
    from services.suites.code import records

    hidden = {r.task_id: r.hidden for r in records()}
    for t in trajs:
        shown = "\n".join(m.content or "" for m in t.messages if m.role != "assistant")
        assert "# sandbox: " in shown or t.turns == 1
        for statement in hidden[t.task_id]:
            assert statement not in shown, (t.task_id, statement)
            expected = statement.rpartition("==")[2].strip()
            if len(expected) > 6:  # a distinctive expected value, not `True` or `0`
                assert expected not in shown, (t.task_id, expected)


def check_episode(t: Trajectory) -> None:
    mask = t.completion_mask
    versions = list(unpack_i32(t.policy_versions))
    assert 1 <= t.turns <= 3 and len(t.messages) == 2 * t.turns
    if t.turns == 1:
        assert mask is None
        return
    assert mask is not None and 0 in mask and mask[0] == 1
    for m, v in zip(mask, versions, strict=True):
        assert (v == -1) == (m == 0) and (m == 0 or v == 0)
    observations = [m.content or "" for m in t.messages[2::2]]
    assert all(o.startswith("\n# sandbox: ") for o in observations)
    assert t.completion == t.messages[-1].content


async def read_trajectories(s: Settings, n: int) -> list[Trajectory]:
    consumer = kafka.consumer(s, "test-multiturn-read")
    await consumer.start()
    out: list[Trajectory] = []
    try:
        await kafka.assign_all(s, consumer, [kafka.topic(s, topics.TRAJECTORIES)])
        for _ in range(60):
            if len(out) >= n:
                break
            batches = await consumer.getmany(timeout_ms=500)
            out += [codec.decode(r.value, Trajectory) for rs in batches.values() for r in rs]
    finally:
        await consumer.stop()
    assert len(out) == n
    return out
