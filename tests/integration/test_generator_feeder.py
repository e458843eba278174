"""The task feeder against the local stack: admission (malformed lines, unknown verifiers,
references that fail their own verifier, in-process and in a real sandbox worker) with
dead letters carrying the reasons; only admitted train tasks are fed; the backlog bound
holds until the generators' group takes tasks."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from pathlib import Path
from typing import Any

import pytest

from schemas import codec, topics
from schemas.rollout import Task
from schemas.transport import DeadLetter
from services import kafka
from services import topics as topic_admin
from services.rollout.feeder import Feeder
from services.settings import Settings
from tests.integration.test_generator_multiturn import sandbox_worker

pytestmark = pytest.mark.timeout(240)

GOOD_CODE = {
    "task_id": "code/double", "suite": "files", "prompt": "f doubles x\n",
    "verifier": {"name": "python_tests",
                 "tests": "from solution import f\n\ndef test_a():\n    assert f(2) == 4\n"},
    "reference": "def f(x): return 2 * x",
}  # fmt: skip
BAD_CODE = {**GOOD_CODE, "task_id": "code/wrong", "reference": "def f(x): return x + 1"}
LINES = [
    json.dumps({"task_id": "m/1", "suite": "files", "prompt": "1+1=",
                "verifier": {"name": "math_answer", "answer": "2"}, "reference": "2"}),
    json.dumps({"task_id": "m/2", "suite": "files", "prompt": "2+2=",
                "verifier": {"name": "math_answer", "answer": "4"}, "reference": "5"}),
    json.dumps({"task_id": "m/held", "suite": "files", "prompt": "3+3=",
                "verifier": {"name": "math_answer", "answer": "6"},
                "metadata": {"split": "heldout"}}),
    "{this is not json",
    json.dumps({"task_id": "m/3", "suite": "files", "prompt": "x",
                "verifier": {"name": "telepathy"}}),
    json.dumps(GOOD_CODE),
    json.dumps(BAD_CODE),
]  # fmt: skip


def feeder_settings(settings: Settings, prefix: str, task_file: Path, **feeder: Any) -> Settings:
    return settings.model_copy(
        update={
            "topics": settings.topics.model_copy(update={"prefix": prefix}),
            "feeder": settings.feeder.model_copy(
                update={"suites": {"files": 1.0}, "task_files": [task_file], **feeder}
            ),
        }
    )


async def read(s: Settings, spec: topics.TopicSpec) -> list[Any]:
    consumer = kafka.consumer(s, "test-feeder-read")
    await consumer.start()
    try:
        tps = await kafka.assign_all(s, consumer, [kafka.topic(s, spec)])
        ends = await consumer.end_offsets(tps)
        out: list[Any] = []
        for _ in range(100):
            if all([await consumer.position(tp) >= ends[tp] for tp in tps]):
                break
            batches = await consumer.getmany(timeout_ms=300)
            out += [codec.decode(r.value) for rs in batches.values() for r in rs]
        return out
    finally:
        await consumer.stop()


async def test_admission_and_dead_letters(
    settings: Settings, prefix: str, tmp_path: Path, docker_client: object
) -> None:
    task_file = tmp_path / "tasks.jsonl"
    task_file.write_text("# a comment\n" + "\n".join(LINES) + "\n")
    s = feeder_settings(settings, prefix, task_file, max_tasks=12, max_backlog=1000)
    await topic_admin.ensure(s)
    feeder = Feeder(s)
    with sandbox_worker(prefix, tmp_path / "worker.log"):
        await feeder.start()
        try:
            await asyncio.wait_for(feeder.admit_all(feeder.candidates()), 150)
            await asyncio.wait_for(feeder.feed(), 60)
        finally:
            await feeder.close()
    summary = feeder.summary
    assert summary.admitted == 2 and summary.rejected == 4, summary.reasons
    fed = await read(s, topics.TASKS)
    assert len(fed) == 12 and all(isinstance(t, Task) for t in fed)
    assert {t.task_id for t in fed} == {"m/1", "code/double"}
    assert len({t.id for t in fed}) == 12  # every publication is a message of its own
    letters: list[DeadLetter] = await read(s, topics.DLQ)
    reasons = sorted(d.reason for d in letters)
    assert len(letters) == 4
    assert any("not JSON" in r for r in reasons)
    assert any("unknown verifier 'telepathy'" in r for r in reasons)
    assert sum("reference solution fails its own verifier" in r for r in reasons) == 2
    assert all(d.source_topic == f"file:{task_file}" for d in letters)
    assert any(b"code/wrong" in d.original for d in letters)


async def test_backlog_bound_until_the_generators_take_tasks(
    settings: Settings, prefix: str, tmp_path: Path
) -> None:
    from aiokafka import AIOKafkaConsumer

    task_file = tmp_path / "tasks.jsonl"
    task_file.write_text(LINES[0] + "\n")
    s = feeder_settings(settings, prefix, task_file, max_backlog=5)
    await topic_admin.ensure(s)
    feeder = Feeder(s)
    running = asyncio.create_task(feeder.run())
    try:
        await until(lambda: sum(feeder.summary.published.values()) >= 5)
        await asyncio.sleep(2)
        assert sum(feeder.summary.published.values()) == 5  # held at the bound
        taker = AIOKafkaConsumer(
            kafka.topic(s, topics.TASKS), bootstrap_servers=s.kafka.endpoint,
            group_id=f"{prefix}.generators", enable_auto_commit=False,
            auto_offset_reset="earliest",
        )  # fmt: skip
        await taker.start()
        try:
            taken = 0
            for _ in range(40):
                batches = await taker.getmany(timeout_ms=500, max_records=3 - taken)
                for tp, rs in batches.items():
                    taken += len(rs)
                    await taker.commit({tp: rs[-1].offset + 1})
                if taken >= 3:
                    break
        finally:
            await taker.stop()
        await until(lambda: sum(feeder.summary.published.values()) >= 8)
        await asyncio.sleep(2)
        assert sum(feeder.summary.published.values()) == 8
    finally:
        feeder.request_stop()
        await asyncio.wait_for(running, 30)


async def until(predicate: Any, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.2)


async def test_sandboxed_suites_pause_while_the_sandbox_is_backed_up(
    settings: Settings, prefix: str, tmp_path: Path
) -> None:
    from schemas.sandbox import SandboxRequest, VerifierSpec

    base = settings.model_copy(
        update={"topics": settings.topics.model_copy(update={"prefix": prefix})}
    )
    await topic_admin.ensure(base)
    producer = kafka.producer(base, "test-feeder-backlog")
    await producer.start()
    try:  # 70 requests no worker will take: a sandbox tier 70 deep
        for i in range(70):
            req = SandboxRequest(
                request_id=f"r{i}", trajectory_id=f"t{i}", group_id=f"g{i}", code="",
                verifier=VerifierSpec(name="python_tests", tests="x"),
            )  # fmt: skip
            topic = kafka.topic(base, topics.SANDBOX_REQUESTS)
            await producer.send_and_wait(topic, codec.encode(req), req.request_id.encode())
    finally:
        await producer.stop()

    async def fed_suites(limit: int) -> set[str]:
        feeder_cfg = base.feeder.model_copy(
            update={
                "suites": {"arith": 1.0, "pyfunc": 1.0}, "max_tasks": 40, "max_backlog": 1000,
                "check_references": False, "max_sandbox_backlog": limit,
            }
        )  # fmt: skip
        summary = await asyncio.wait_for(
            Feeder(base.model_copy(update={"feeder": feeder_cfg})).run(), 60
        )
        return set(summary.published)

    assert await fed_suites(16) == {"arith"}
    assert await fed_suites(0) == {"arith", "pyfunc"}

    # sandbox_backpressure "all": nothing is fed while the tier is backed up ...
    cfg = base.feeder.model_copy(
        update={
            "suites": {"arith": 1.0, "pyfunc": 1.0}, "max_tasks": 40, "max_backlog": 1000,
            "check_references": False, "max_sandbox_backlog": 16, "sandbox_backpressure": "all",
        }
    )  # fmt: skip
    feeder = Feeder(base.model_copy(update={"feeder": cfg}))
    running = asyncio.create_task(feeder.run())
    try:
        await asyncio.sleep(4)
        assert not running.done()
        assert feeder.summary.published == {}
        await _drain_sandbox_requests(base)  # ... and both suites once it has drained
        summary = await asyncio.wait_for(running, 60)
    finally:
        feeder.request_stop()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(running, 30)
    assert set(summary.published) == {"arith", "pyfunc"}
    assert sum(summary.published.values()) == 40


async def _drain_sandbox_requests(s: Settings) -> None:
    """Commit the sandbox workers' group to the end of `sandbox.requests`, as workers that
    took every request would."""
    name = kafka.topic(s, topics.SANDBOX_REQUESTS)
    taker = kafka.consumer(s, "test-drain", group_id=kafka.group(s, topics.SANDBOX_WORKERS))
    await taker.start()
    try:
        parts = await kafka.topic_partitions(s, [name])
        taker.assign(parts)
        ends = await taker.end_offsets(parts)
        await taker.commit({tp: off for tp, off in ends.items()})
    finally:
        await taker.stop()
