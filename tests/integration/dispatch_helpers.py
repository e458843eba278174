"""Helpers of the dispatcher integration tests: run services as processes, feed and read
topics. Every wait is bounded in time."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path

from schemas import codec, topics
from schemas.envelope import Message
from schemas.rollout import Trajectory
from schemas.sandbox import VerifierSpec
from services.settings import Settings

ROOT = Path(__file__).resolve().parents[2]

TESTS = "from solution import add\n\ndef test_small():\n    assert add(2, 3) == 5\n\n" + (
    "def test_negative():\n    assert add(-4, 1) == -3\n"
)
GOOD = "```python\ndef add(a, b):\n    return a + b\n```"
HALF = "```python\ndef add(a, b):\n    return 5 if a == 2 else 0\n```"
BAD = "```python\ndef add(a, b):\n    return a - b\n```"


def with_prefix(settings: Settings, prefix: str) -> Settings:
    return settings.model_copy(
        update={"topics": settings.topics.model_copy(update={"prefix": prefix})}
    )


def group_of(task: str, group: str, completions: list[str], sandbox: bool) -> list[Trajectory]:
    if sandbox:
        verifier = VerifierSpec(name="python_tests", tests=TESTS)
    else:
        verifier = VerifierSpec(name="exact", answer="42", needs_sandbox=False)
    return [
        Trajectory(
            task_id=task,
            group_id=group,
            group_size=len(completions),
            index=i,
            verifier=verifier,
            completion=c,
        )
        for i, c in enumerate(completions)
    ]


class Service:
    """One `rollstream ...` service in a subprocess of its own session."""

    def __init__(self, args: list[str], env: dict[str, str], log: Path) -> None:
        self.args, self.env, self.log = args, env, log
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Service:
        out = self.log.open("ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "services.cli", *self.args],
            env=self.env,
            cwd=ROOT,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        return self

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def tail(self, lines: int = 60) -> str:
        """The last `lines` lines of the service's log (pytest shows what a test's teardown
        prints only when the test failed: a fault test that times out leaves evidence)."""
        try:
            text = self.log.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self, timeout: float = 30) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()


def service_env(prefix: str, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["ROLLSTREAM__TOPICS__PREFIX"] = prefix
    # faust's INFO lines (rebalances, recovery, offsets) are the evidence when a fault test fails
    env.setdefault("ROLLSTREAM__DISPATCHER__LOG_LEVEL", "info")
    env.update(extra)
    return env


async def produce(settings: Settings, records: Iterable[tuple[str, bytes | None, bytes]]) -> None:
    from aiokafka import AIOKafkaProducer

    producer = AIOKafkaProducer(
        bootstrap_servers=settings.kafka.endpoint, acks="all", enable_idempotence=True
    )
    await producer.start()
    try:
        futures = [await producer.send(t, v, key=k) for t, k, v in records]
        await asyncio.gather(*futures)
    finally:
        await producer.stop()


async def consume(
    settings: Settings,
    topic: str,
    expected: type[Message] | None,
    want: int,
    timeout_s: float,
    settle_s: float = 0.0,
) -> list[Message]:
    """Read `topic` from the start (read_committed) until `want` records, then `settle_s`
    more seconds to catch any extra (duplicates), or until `timeout_s`."""
    from aiokafka import AIOKafkaConsumer

    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=settings.kafka.endpoint,
        auto_offset_reset="earliest",
        isolation_level="read_committed",
        enable_auto_commit=False,
        max_partition_fetch_bytes=8 << 20,
    )
    await consumer.start()
    out: list[Message] = []
    deadline = time.monotonic() + timeout_s
    settle_until: float | None = None
    try:
        while time.monotonic() < deadline:
            if settle_until is None and len(out) >= want:
                settle_until = time.monotonic() + settle_s
            if settle_until is not None and time.monotonic() >= settle_until:
                break
            batch = await consumer.getmany(timeout_ms=500)
            for records in batch.values():
                for r in records:
                    out.append(
                        codec.decode(r.value, expected) if expected else codec.decode(r.value)
                    )
    finally:
        await consumer.stop()
    return out


def _decode(value: bytes, expected: type[Message] | None) -> Message:
    return codec.decode(value) if expected is None else codec.decode(value, expected)


def topic(settings: Settings, spec: topics.TopicSpec) -> str:
    return spec.full_name(settings.topics.prefix)
