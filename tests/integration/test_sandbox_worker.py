"""The sandbox worker service on the real Kafka: exactly one result per request even when a
worker is SIGKILLed midway; DLQ for undecodable requests; dedup by request_id+attempt;
clean SIGTERM shutdown that leaves no container behind."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from schemas import topics as registry
from schemas.codec import decode, encode
from schemas.sandbox import Outcome, SandboxRequest, SandboxResult, VerifierSpec
from schemas.transport import DeadLetter
from services import topics
from services.settings import Settings
from tests.integration.sandbox_leaks import owned_by
from tests.unit.sandbox_programs import ADD_TESTS, GOOD

ROOT = Path(__file__).resolve().parents[2]
N_REQUESTS = 200


def run_settings(settings: Settings, prefix: str) -> Settings:
    return settings.model_copy(
        update={"topics": settings.topics.model_copy(update={"prefix": prefix})}
    )


def request(i: int, attempt: int = 0, **kw: Any) -> SandboxRequest:
    kw.setdefault("verifier", VerifierSpec(name="python_tests", tests=ADD_TESTS))
    kw.setdefault("code", GOOD)
    kw.setdefault("timeout_s", 5.0)
    return SandboxRequest(
        request_id=f"req-{i}", attempt=attempt, trajectory_id=f"traj-{i}",
        group_id=f"group-{i % 7}", **kw,
    )  # fmt: skip


async def produce(settings: Settings, prefix: str, values: list[tuple[bytes, bytes]]) -> None:
    from aiokafka import AIOKafkaProducer

    producer = AIOKafkaProducer(
        bootstrap_servers=settings.kafka.endpoint, acks="all", enable_idempotence=True
    )
    await producer.start()
    try:
        name = registry.SANDBOX_REQUESTS.full_name(prefix)
        await asyncio.gather(*[producer.send_and_wait(name, v, key=k) for k, v in values])
    finally:
        await producer.stop()


async def read_all(settings: Settings, topic: str, quiet_s: float = 2.0) -> list[bytes]:
    """Every committed record of `topic` (read_committed), until none came for quiet_s."""
    from aiokafka import AIOKafkaConsumer, TopicPartition

    consumer = AIOKafkaConsumer(
        bootstrap_servers=settings.kafka.endpoint, isolation_level="read_committed",
        enable_auto_commit=False, auto_offset_reset="earliest",
    )  # fmt: skip
    await consumer.start()
    out: list[bytes] = []
    try:
        spec = registry.BY_NAME[topic.split(".", 1)[1]]
        parts = range(spec.partition_count(settings.topics.partitions))
        consumer.assign([TopicPartition(topic, p) for p in parts])
        await consumer.seek_to_beginning()
        last = time.monotonic()
        while time.monotonic() - last < quiet_s:
            batch = await consumer.getmany(timeout_ms=300)
            for records in batch.values():
                out += [r.value for r in records if r.value is not None]
                last = time.monotonic()
    finally:
        await consumer.stop()
    return out


def start_worker(prefix: str, worker_id: str, n: int = 1) -> tuple[subprocess.Popen[bytes], Path]:
    argv = [
        sys.executable, "-m", "services.cli", "sandbox-worker", "--prefix", prefix,
        "--worker-id", worker_id, "--pool-size", "2",
    ]  # fmt: skip
    path = Path(f"/tmp/rollstream-test-worker-{prefix}-{worker_id}-{n}.log")
    with path.open("wb") as log:
        proc = subprocess.Popen(argv, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    return proc, path


async def until_serving(path: Path, timeout_s: float = 60.0) -> None:
    """A restarted worker is restarted once it serves (it reaps its predecessor's pool first)."""
    deadline = time.monotonic() + timeout_s
    while b"sandbox worker" not in (log := await asyncio.to_thread(path.read_bytes)):
        assert time.monotonic() < deadline, f"worker did not start: {log[-2000:]!r}"
        await asyncio.sleep(0.2)


async def results_by_request(settings: Settings, prefix: str) -> Counter[str]:
    values = await read_all(settings, registry.SANDBOX_RESULTS.full_name(prefix), quiet_s=1.0)
    results = [decode(v, SandboxResult) for v in values]
    return Counter(f"{r.request_id}#{r.attempt}" for r in results)


async def serve_in_process(
    run: Settings, dedup_ns: str, until: Any, worker_id: str = "drain"
) -> None:
    """One in-process worker (local runner, 2 jobs at once) until `until(worker)` is true
    or it stops (a minute at most); then stopped as by SIGTERM."""
    from sandbox_workers.dedup import Dedup
    from sandbox_workers.local import LocalRunner
    from sandbox_workers.sandbox import VerifyingSandbox
    from services import blobs, sandbox_wiring

    sandbox = VerifyingSandbox(LocalRunner(concurrency=2), worker_id=worker_id)
    claim_check = blobs.from_settings(run)
    dedup = Dedup(run.redis.endpoint, dedup_ns, 60)
    worker = sandbox_wiring.worker(run, sandbox, worker_id, claim_check, dedup)
    stop = asyncio.Event()
    task = asyncio.create_task(worker.run(stop))
    try:
        for _ in range(300):
            if await until(worker) or task.done():
                break
            await asyncio.sleep(0.2)
    finally:
        stop.set()
        await asyncio.wait_for(task, 60)
        await sandbox.close()
        await claim_check.aclose()
        await dedup.close()


async def test_exactly_one_result_per_request_across_a_sigkill(
    settings: Settings, prefix: str, _stack_up: None
) -> None:
    run = run_settings(settings, prefix)
    await topics.ensure(run)
    # every 10th job sleeps: results go out of offset order, the commits mark them answered
    slow = "import time\ntime.sleep(1.0)\n" + GOOD
    reqs = [request(i, code=slow if i % 10 == 0 else GOOD) for i in range(N_REQUESTS)]
    await produce(run, prefix, [(r.request_id.encode(), encode(r)) for r in reqs])
    (a, _), (b, _) = start_worker(prefix, "a"), start_worker(prefix, "b")
    procs = [a, b]
    try:
        seen: Counter[str] = Counter()
        deadline = time.monotonic() + 240
        while sum(seen.values()) < N_REQUESTS // 3 and time.monotonic() < deadline:
            await asyncio.sleep(1.0)
            seen = await results_by_request(run, prefix)
        assert seen, "no result arrived: see /tmp/rollstream-test-worker-*.log"
        os.kill(a.pid, signal.SIGKILL)  # midway, with jobs and perhaps a transaction open
        a.wait()
        a2, a2_log = start_worker(prefix, "a", 2)  # same id: fences the dead one
        procs.append(a2)
        await until_serving(a2_log)
        while len(seen) < N_REQUESTS and time.monotonic() < deadline:
            await asyncio.sleep(2.0)
            seen = await results_by_request(run, prefix)
        for p in (b, a2):
            p.send_signal(signal.SIGTERM)
        codes = [p.wait(timeout=60) for p in (b, a2)]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    final = await results_by_request(run, prefix)
    assert len(final) == N_REQUESTS, f"missing: {N_REQUESTS - len(final)}"
    dupes = {k: n for k, n in final.items() if n > 1}
    assert not dupes, f"duplicated results: {dupes}"
    assert codes == [0, 0], "a worker did not shut down cleanly on SIGTERM"
    # the killed worker's pool was reaped by its successor; the others removed their own
    assert not owned_by(run, [p.pid for p in procs]), "sandbox containers left behind"


async def test_dead_letters_dedup_and_inline_verifiers(settings: Settings, prefix: str) -> None:
    from services import blobs

    run = run_settings(settings, prefix)
    await topics.ensure(run)
    math = request(3, code="\\boxed{42}", verifier=VerifierSpec(name="math_answer", answer="42"))
    big = request(4, code="# " + "x" * 400_000 + "\n" + GOOD)  # over the inline limit
    packer = blobs.from_settings(run)
    big_value = await packer.pack(big)
    await packer.aclose()
    assert len(big_value) < 10_000  # travels as a claim-check reference
    records = [
        (b"garbage", b"\x93not a message"),
        (b"req-1", encode(request(1))),
        (b"req-1", encode(request(1))),  # published twice upstream: answered once
        (b"req-1", encode(request(1, attempt=1))),  # a retry: answered
        (b"req-3", encode(math)),
        (b"req-4", big_value),
    ]
    await produce(run, prefix, records)

    async def four_answered(_worker: Any) -> bool:
        return len(await results_by_request(run, prefix)) >= 4

    await serve_in_process(run, prefix, four_answered, worker_id="inproc")
    seen = await results_by_request(run, prefix)
    assert seen == Counter({"req-1#0": 1, "req-1#1": 1, "req-3#0": 1, "req-4#0": 1})
    letters = [decode(v, DeadLetter) for v in await read_all(run, registry.DLQ.full_name(prefix))]
    assert len(letters) == 1 and "undecodable sandbox request" in letters[0].reason
    assert letters[0].original == b"\x93not a message" and letters[0].source_offset >= 0
    results = [decode(v, SandboxResult) for v in await read_all(run, f"{prefix}.sandbox.results")]
    by_id = {r.request_id: r for r in results}
    assert (
        by_id["req-3"].outcome == Outcome.PASSED and by_id["req-3"].verifier_name == "math_answer"
    )
    assert by_id["req-1"].worker_id.startswith("inproc") and by_id["req-1"].image_digest
    assert by_id["req-4"].outcome == Outcome.PASSED


async def test_stop_with_jobs_in_flight_loses_and_repeats_nothing(
    settings: Settings, prefix: str, tmp_path: Path
) -> None:
    """Stopped while jobs run (grace too short to finish them): they stay uncommitted and
    the next worker answers each of them once."""
    from prometheus_client import REGISTRY

    run = run_settings(settings, prefix)
    run = run.model_copy(
        update={"sandbox": run.sandbox.model_copy(update={"shutdown_grace_s": 0.1})}
    )
    await topics.ensure(run)
    flag = tmp_path / "hold"
    flag.touch()  # (local runner: the job sees this machine's files) jobs wait while it exists
    held = f"import os, time\nwhile os.path.exists({str(flag)!r}):\n    time.sleep(0.05)\n" + GOOD
    reqs = [(f"req-{i}".encode(), encode(request(i, code=held, timeout_s=60.0))) for i in range(6)]
    await produce(run, prefix, reqs)
    before = REGISTRY.get_sample_value("rollstream_sandbox_transactions_total") or 0.0

    async def busy(worker: Any) -> bool:
        return len(worker.tasks) >= 2

    await serve_in_process(run, prefix, busy)
    assert await results_by_request(run, prefix) == Counter()  # nothing half-done published
    flag.unlink()

    async def all_answered(_worker: Any) -> bool:
        return len(await results_by_request(run, prefix)) == 6

    await serve_in_process(run, prefix, all_answered)
    final = await results_by_request(run, prefix)
    assert final == Counter({f"req-{i}#0": 1 for i in range(6)}), final
    after = REGISTRY.get_sample_value("rollstream_sandbox_transactions_total") or 0.0
    assert after > before  # the worker's metrics count its commits
