"""The learner service on the real stack, killed with SIGKILL and restarted.

ScoredTrajectory messages are produced straight to the rewards topic of a test-only
prefix; the learner runs as a subprocess (tests/integration/learner_child.py).
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import msgpack
import pytest

from learner.synthetic import scored
from learner.weights import fetch
from schemas import codec
from schemas.messages import DeadLetter, LedgerEntry, LedgerStatus, ScoredTrajectory, WeightUpdate
from services import kafka, topics
from services.settings import Settings

CHILD = Path(__file__).with_name("learner_child.py")
ROOT = Path(__file__).resolve().parents[2]


def _overrides(prefix: str, tmp: Path, store: str) -> list[str]:
    return [
        f"topics.prefix={prefix}",
        f"learner.checkpoint_dir={tmp / 'ckpt'}",
        f"learner.weight_store={store}",
        f"learner.weight_dir={tmp / 'weights'}",
        "learner.weight_keep=1000",  # keep every blob, so every announcement is checkable
        "learner.tiny_dim=32",
        "learner.tiny_layers=1",
        "learner.tiny_heads=2",
        "learner.max_seq_len=64",
        "learner.batch_tokens=256",  # 8 samples of 32 tokens per step
        "learner.micro_batch_tokens=256",
        "learner.batch_max_wait_s=0.5",
        "learner.checkpoint_every=4",
        "learner.max_lag=8",
        "learner.lr=1e-3",
        f"learner.tensorboard_dir={tmp / 'tb'}",
    ]


class Child:
    def __init__(self, tmp: Path, name: str, args: list[str]) -> None:
        self.out, self.err = tmp / f"{name}.out", tmp / f"{name}.err"
        env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
        with self.out.open("wb") as out, self.err.open("wb") as err:
            self.proc = subprocess.Popen(
                [sys.executable, str(CHILD), *args], stdout=out, stderr=err, env=env, cwd=ROOT
            )

    def text(self) -> str:
        return self.out.read_text() + self.err.read_text()

    def wait_for(self, pattern: str, timeout: float = 90) -> re.Match[str]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = re.search(pattern, self.text())
            if found:
                return found
            assert self.proc.poll() is None, f"learner exited early:\n{self.text()[-3000:]}"
            time.sleep(0.2)
        raise AssertionError(f"no {pattern!r} within {timeout} s:\n{self.text()[-3000:]}")

    def wait_idle(self, quiet_s: float = 2.0, timeout: float = 90) -> None:
        deadline, last, since = time.monotonic() + timeout, "", time.monotonic()
        while time.monotonic() < deadline:
            now = self.text()
            if now != last:
                last, since = now, time.monotonic()
            elif time.monotonic() - since > quiet_s:
                return
            time.sleep(0.2)
        raise AssertionError("the learner never went quiet")

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)

    def finish(self, timeout: float = 180) -> str:
        try:
            self.proc.wait(timeout=timeout)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
        assert self.proc.returncode == 0, self.text()[-3000:]
        return self.text()


def _run(settings: Settings, prefix: str) -> Settings:
    return settings.model_copy(
        update={"topics": settings.topics.model_copy(update={"prefix": prefix})}
    )


async def _produce(settings: Settings, prefix: str, values: list[tuple[bytes, bytes]]) -> None:
    from aiokafka import AIOKafkaProducer

    producer = AIOKafkaProducer(
        bootstrap_servers=settings.kafka.endpoint, acks="all", enable_idempotence=True
    )
    await producer.start()
    try:
        futures = [await producer.send(f"{prefix}.rewards", v, key=k) for k, v in values]
        await asyncio.gather(*futures)
    finally:
        await producer.stop()


async def _read(settings: Settings, topic: str) -> list[tuple[bytes | None, bytes]]:
    from aiokafka import AIOKafkaConsumer, TopicPartition

    c = AIOKafkaConsumer(bootstrap_servers=settings.kafka.endpoint, enable_auto_commit=False)
    await c.start()
    try:
        tps = [TopicPartition(topic, p) for p in await kafka.partitions(settings, topic)]
        c.assign(tps)
        await c.seek_to_beginning(*tps)
        ends = await c.end_offsets(tps)
        out: list[tuple[bytes | None, bytes]] = []
        async with asyncio.timeout(60):
            while [tp for tp in tps if await c.position(tp) < ends[tp]]:
                for msgs in (await c.getmany(timeout_ms=500)).values():
                    out += [(m.key, m.value) for m in msgs if m.value is not None]
        return out
    finally:
        await c.stop()


def _batch(start: int, n: int, version_of: int | None = None) -> list[ScoredTrajectory]:
    out = []
    for i in range(start, start + n):
        out.append(
            scored(
                list(range(1, 9)),
                [(7 * i + k) % 250 for k in range(24)],
                advantage=1.0 if i % 2 else -1.0,
                reward=float(i % 2),
                logprobs=[-5.5] * 24,
                version=i // 8 if version_of is None else version_of,
                group_id=f"g{i // 2}",
                group_size=2,
                index=i % 2,
            )
        )
    return out


def _records(msgs: list[ScoredTrajectory]) -> list[tuple[bytes, bytes]]:
    return [(m.group_id.encode(), codec.encode(m)) for m in msgs]


async def _check_announcements(settings: Settings, prefix: str) -> list[WeightUpdate]:
    updates = [codec.decode(v, WeightUpdate) for _, v in await _read(settings, f"{prefix}.weights")]
    versions = [u.version for u in updates]
    assert versions == sorted(set(versions)), f"versions not strictly increasing: {versions}"
    for u in updates:  # each points at a complete blob whose sha256 matches
        state = fetch(u.uri, u.sha256, redis_url=settings.redis.endpoint)
        assert state and u.size_bytes > 0
    return updates


def _fates(entries: list[LedgerEntry]) -> dict[str, list[LedgerEntry]]:
    """Distinct ledger entries per trajectory (re-sent entries keep their message id)."""
    by_id: dict[str, LedgerEntry] = {e.id: e for e in entries}
    fates: dict[str, list[LedgerEntry]] = defaultdict(list)
    for e in by_id.values():
        fates[e.trajectory_id].append(e)
    return fates


@pytest.fixture(scope="module")
def kafka_redis(settings: Settings) -> None:
    """The learner needs Kafka and Redis of the local stack (not Docker)."""
    from services.infra import kafka, redis_local

    down = [c for c in (kafka.probe(settings), redis_local.probe(settings)) if not c.healthy]
    if down:
        lines = "\n".join(f"  {c.component}: {c.detail} ({c.fix})" for c in down)
        pytest.fail(f"the local stack is not up; run `make up` (or `rollstream up`):\n{lines}")


@pytest.fixture
def redis_cleanup(settings: Settings, prefix: str) -> Iterator[None]:
    yield
    import redis

    client = redis.Redis.from_url(settings.redis.endpoint)
    keys = list(client.scan_iter(f"rollstream:{prefix}:*", count=1000))
    if keys:
        client.delete(*keys)
    client.close()


async def test_sigkill_and_restart_trains_every_reward_once(
    settings: Settings, prefix: str, tmp_path: Path, kafka_redis: None, redis_cleanup: None
) -> None:
    run = _run(settings, prefix)
    await topics.ensure(run)
    first = _batch(0, 120)
    too_long = scored(list(range(60)), [1] * 24, advantage=1.0, logprobs=[-1.0] * 24)
    masked = scored([1, 2], [3, 4], advantage=0.0, logprobs=[-1.0] * 2, masked=True)
    extra = [(b"x", b"\x93not a message"), *_records([too_long, masked]), *_records(first[:1])]
    await _produce(run, prefix, _records(first) + extra)  # the last record is a duplicate

    a = Child(tmp_path, "a", _overrides(prefix, tmp_path, "redis"))
    a.wait_for(r"step 12 ")
    a.wait_idle()
    a.kill()
    killed_step = int(re.findall(r"step (\d+) ", a.text())[-1])
    killed_version = max(int(v) for v in re.findall(r"published version (\d+)", a.text()))
    ckpts = sorted((tmp_path / "ckpt" / prefix / "default").glob("ckpt-*"))
    ckpt_step = msgpack.unpackb((ckpts[-1] / "state.msgpack").read_bytes())["step"]
    assert 0 < ckpt_step <= killed_step

    second = _batch(120, 120)
    stale = _batch(1000, 8, version_of=0)  # 8+ versions behind by now: dropped
    await _produce(run, prefix, _records(second + stale))
    b = Child(tmp_path, "b", [*_overrides(prefix, tmp_path, "redis"), "--idle-exit", "4"])
    log = b.finish()
    resumed = re.search(r"resumed from ckpt-\d+: step (\d+), version (\d+)", log)
    assert resumed and int(resumed[1]) == ckpt_step and int(resumed[2]) >= killed_version
    first_step_b = int(re.findall(r"step (\d+) ", log)[0])
    assert first_step_b == ckpt_step + 1  # work after the checkpoint is redone

    updates = await _check_announcements(run, prefix)
    assert updates[-1].version > killed_version
    entries = [codec.decode(v, LedgerEntry) for _, v in await _read(run, f"{prefix}.ledger")]
    fates = _fates(entries)
    produced = {m.trajectory_id for m in first + second + stale + [too_long, masked]}
    assert set(fates) == produced
    assert all(len(f) == 1 for f in fates.values()), "a trajectory has two fates"
    status = {t: f[0] for t, f in fates.items()}
    assert all(e.reason for e in status.values() if e.status is not LedgerStatus.TRAINED)
    assert status[masked.trajectory_id].status is LedgerStatus.MASKED
    assert status[too_long.trajectory_id].reason.startswith("too long")
    assert all(status[m.trajectory_id].reason.startswith("stale") for m in stale)
    trained = [e for e in status.values() if e.status is LedgerStatus.TRAINED]
    assert len(trained) >= 120
    counts = {s: sum(e.status is s for e in status.values()) for s in LedgerStatus}
    print(
        f"\nkilled at step {killed_step} (v{killed_version}), checkpoint step {ckpt_step}; "
        f"restart ended at v{updates[-1].version}; fates {counts}; "
        f"ledger records {len(entries)} for {len(fates)} trajectories"
    )
    letters = [codec.decode(v, DeadLetter) for _, v in await _read(run, f"{prefix}.dlq")]
    assert [d.original for d in letters] == [b"\x93not a message"]
    assert list((tmp_path / "tb").glob("events.out.tfevents.*"))  # TensorBoard scalars


@pytest.mark.parametrize("store", ["redis", "dir"])
async def test_kill_during_publication_never_announces_a_partial_blob(
    settings: Settings,
    prefix: str,
    tmp_path: Path,
    store: str,
    kafka_redis: None,
    redis_cleanup: None,
) -> None:
    import redis

    run = _run(settings, prefix)
    await topics.ensure(run)
    msgs = _batch(0, 40, version_of=0)
    await _produce(run, prefix, _records(msgs))
    args = _overrides(prefix, tmp_path, store)
    a = Child(tmp_path, "a", ["--slow-publish", "3", *args])  # 3rd publication: version 2
    a.wait_for(r"HALF-WRITTEN 2")
    a.kill()

    before = await _check_announcements(run, prefix)
    assert [u.version for u in before] == [0, 1]
    if store == "redis":
        client = redis.Redis.from_url(settings.redis.endpoint)
        half = list(client.scan_iter(f"rollstream:{prefix}:weights:default:v00000002-*"))
        client.close()
        assert half and not [k for k in half if k.endswith(b":manifest")]  # chunks, no manifest
    else:
        blobs = os.listdir(tmp_path / "weights" / prefix / "default")
        assert any(n.startswith(".v00000002.") and n.endswith(".tmp") for n in blobs)
        assert not any(n.startswith("v00000002") for n in blobs)

    b = Child(tmp_path, "b", [*args, "--idle-exit", "3"])
    b.finish()
    after = await _check_announcements(run, prefix)
    assert after[:2] == before and after[-1].version >= 2
    entries = [codec.decode(v, LedgerEntry) for _, v in await _read(run, f"{prefix}.ledger")]
    fates = _fates(entries)
    assert set(fates) == {m.trajectory_id for m in msgs}
    assert all(len(f) == 1 for f in fates.values())


async def test_sigterm_stops_cleanly_with_everything_flushed(
    settings: Settings, prefix: str, tmp_path: Path, kafka_redis: None, redis_cleanup: None
) -> None:
    run = _run(settings, prefix)
    await topics.ensure(run)
    msgs = _batch(0, 16, version_of=0)
    await _produce(run, prefix, _records(msgs))
    child = Child(tmp_path, "a", _overrides(prefix, tmp_path, "dir"))  # checkpoint_every=4
    child.wait_for(r"step 2 ")
    child.wait_idle(quiet_s=1.0)
    child.proc.send_signal(signal.SIGTERM)
    assert "DONE steps=2" in child.finish(timeout=60)
    ckpt = sorted((tmp_path / "ckpt" / prefix / "default").glob("ckpt-*"))[-1]
    assert (ckpt / "FLUSHED").exists()  # final checkpoint, outbox sent, offsets committed
    entries = [codec.decode(v, LedgerEntry) for _, v in await _read(run, f"{prefix}.ledger")]
    assert sorted(e.trajectory_id for e in entries) == sorted(m.trajectory_id for m in msgs)
    assert {e.status for e in entries} == {LedgerStatus.TRAINED}
