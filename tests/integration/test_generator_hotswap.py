"""A running generator switches policy versions without restarting, refuses a corrupt
blob (dead letter, old weights kept), and stamps every trajectory with the version that
sampled it: its behaviour logprobs are those of exactly that version's weights."""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

import pytest
import torch

from learner.spec import make_policy
from schemas import codec, topics
from schemas.arrays import unpack_f32, unpack_i32
from schemas.learning import WeightUpdate
from schemas.rollout import Trajectory
from schemas.transport import DeadLetter
from services import kafka, suites
from services import topics as topic_admin
from services.learner_service import weight_store
from services.rollout.generator import Generator
from services.settings import Settings

VERSIONS = (0, 1, 3)  # v2 is announced with a wrong sha256


def run_settings(settings: Settings, prefix: str) -> Settings:
    return settings.model_copy(
        update={
            "topics": settings.topics.model_copy(update={"prefix": prefix}),
            "learner": settings.learner.model_copy(
                update={"tiny_dim": 32, "tiny_layers": 1, "tiny_heads": 2, "max_seq_len": 64}
            ),
            "generator": settings.generator.model_copy(
                update={"pacing": False, "max_new_tokens": 6, "seed": 0, "inflight_updates": False}
            ),
        }
    )


def states(s: Settings) -> dict[int, dict[str, torch.Tensor]]:
    policy = make_policy(s.learner)
    base = policy.weights()
    g = torch.Generator().manual_seed(1)
    out = {0: base}
    for v in (1, 3):  # clearly different distributions
        out[v] = {k: t + 0.5 * torch.randn(t.shape, generator=g) for k, t in base.items()}
    return out


async def announce(s: Settings, producer: Any, version: int, state: dict[str, Any]) -> None:
    stored = await asyncio.to_thread(weight_store(s).put, version, state)
    sha = stored.sha256 if version != 2 else "0" * 64
    update = WeightUpdate(
        policy=s.learner.policy, version=version, step=version, uri=stored.uri, sha256=sha,
        size_bytes=stored.size_bytes,
    )  # fmt: skip
    await producer.send_and_wait(
        kafka.topic(s, topics.WEIGHTS), codec.encode(update), key=s.learner.policy.encode()
    )


async def feed(s: Settings, producer: Any, stop: asyncio.Event) -> None:
    tasks = suites.get("arith", group_size=2).tasks("train")
    for i in range(2000):
        if stop.is_set():
            return
        t = tasks[i % len(tasks)]
        topic = kafka.topic(s, topics.TASKS)
        await producer.send_and_wait(topic, codec.encode(t), t.task_id.encode())
        await asyncio.sleep(0.05)


class Seen:
    """Trajectories and dead letters read back from the run's topics."""

    def __init__(self, s: Settings) -> None:
        self.s = s
        self.trajectories: list[Trajectory] = []
        self.letters: list[DeadLetter] = []
        self.consumer = kafka.consumer(s, "test-hotswap")

    async def start(self) -> None:
        await self.consumer.start()
        names = [kafka.topic(self.s, t) for t in (topics.TRAJECTORIES, topics.DLQ)]
        await kafka.assign_all(self.s, self.consumer, names)

    async def until(self, predicate: Any, timeout_s: float = 90) -> None:
        deadline = time.monotonic() + timeout_s
        while not predicate():
            assert time.monotonic() < deadline, "timed out waiting for the generator"
            batches = await self.consumer.getmany(timeout_ms=300)
            for rec in (r for rs in batches.values() for r in rs):
                msg = codec.decode(rec.value)
                if isinstance(msg, Trajectory):
                    self.trajectories.append(msg)
                elif isinstance(msg, DeadLetter):
                    self.letters.append(msg)

    def count(self, version: int) -> int:
        return sum(t.policy_version == version for t in self.trajectories)


async def test_hot_swap_mid_run(settings: Settings, prefix: str, _stack_up: None) -> None:
    s = run_settings(settings, prefix)
    await topic_admin.ensure(s)
    weights = states(s)
    producer = kafka.producer(s, "test-hotswap")
    await producer.start()
    seen = Seen(s)
    await seen.start()
    stop = asyncio.Event()
    gen = Generator(s, idle_exit_s=30)
    running = asyncio.create_task(gen.run())
    feeding = asyncio.create_task(feed(s, producer, stop))
    try:
        await announce(s, producer, 0, weights[0])
        await seen.until(lambda: seen.count(0) >= 10)
        await announce(s, producer, 1, weights[1])
        await seen.until(lambda: seen.count(1) >= 10)
        n_before_bad = len(seen.trajectories)
        await announce(s, producer, 2, weights[3])
        await seen.until(lambda: any("weights v2" in d.reason for d in seen.letters))
        await seen.until(lambda: len(seen.trajectories) >= n_before_bad + 20)
        await announce(s, producer, 3, weights[3])
        await seen.until(lambda: seen.count(3) >= 10)
        assert not running.done(), "the generator stopped or restarted mid-run"
    finally:
        stop.set()
        gen.request_stop()
        feeding.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await feeding
        summary = await asyncio.wait_for(running, 60)
        await seen.consumer.stop()
        await producer.stop()
    assert summary.swaps == 2 and summary.weight_failures == 1
    assert {t.policy_version for t in seen.trajectories} == set(VERSIONS)
    check_versions(seen.trajectories, s, weights)


def check_versions(trajs: list[Trajectory], s: Settings, weights: dict[int, Any]) -> None:
    """Versions never go back (in sampling order); each trajectory's behaviour logprobs are
    those of its stamped version's weights, not of another version's."""
    ordered = sorted(trajs, key=lambda t: t.created_at)
    versions = [t.policy_version for t in ordered]
    assert versions == sorted(versions)
    policy = make_policy(s.learner)
    for v in VERSIONS:
        sample = [t for t in ordered if t.policy_version == v][:6]
        for t in sample:
            assert set(unpack_i32(t.policy_versions)) == {v}
            assert _max_gap(policy, weights[v], t) < 1e-3
            other = VERSIONS[(VERSIONS.index(v) + 1) % len(VERSIONS)]
            assert _max_gap(policy, weights[other], t) > 1e-2 or not len(t.completion_tokens)


def _max_gap(policy: Any, state: dict[str, Any], t: Trajectory) -> float:
    policy.load_weights(state)
    prompt, completion = list(unpack_i32(t.prompt_tokens)), list(unpack_i32(t.completion_tokens))
    if not completion:
        return 0.0
    tokens = torch.tensor([prompt + completion])
    with torch.no_grad():
        logp, _ = policy.token_logprobs(tokens)
    mine = logp[0, len(prompt) - 1 :]
    behaviour = torch.tensor(list(unpack_f32(t.behaviour_logprobs or b"")))
    return float((mine - behaviour).abs().max())


pytestmark = pytest.mark.timeout(240)
