"""The sandbox worker publishes a result as soon as its job ends (real Kafka and Redis): a
held job holds back no later result of its partition, the commit marks those results
answered (schemas/answered.py), and the worker that takes the partition over runs only
what is left, so every request is answered exactly once."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from schemas import answered
from schemas import topics as registry
from schemas.codec import encode
from services import kafka, topics
from services.settings import Settings
from tests.integration.test_sandbox_worker import (
    produce,
    request,
    results_by_request,
    run_settings,
    serve_in_process,
)
from tests.unit.sandbox_programs import GOOD

N_FAST = 6


async def _commit(run: Settings) -> tuple[int, str]:
    """The sandbox workers' committed offset and metadata on the requests' one partition."""
    admin = kafka.admin(run)
    await admin.start()
    try:
        group = kafka.group(run, registry.SANDBOX_WORKERS)
        got = await admin.list_consumer_group_offsets(group)
    finally:
        await admin.close()
    (meta,) = [m for tp, m in got.items() if tp.topic.endswith(".sandbox.requests")]
    return meta.offset, meta.metadata


async def test_a_held_job_holds_back_nothing_and_its_successor_runs_only_it(
    settings: Settings, prefix: str, tmp_path: Path
) -> None:
    run = run_settings(settings, prefix)
    run = run.model_copy(
        update={"sandbox": run.sandbox.model_copy(update={"shutdown_grace_s": 0.1})}
    )
    await topics.ensure(run)
    flag = tmp_path / "hold"
    flag.touch()  # (local runner: the job sees this machine's files) req-0 waits while it exists
    held = f"import os, time\nwhile os.path.exists({str(flag)!r}):\n    time.sleep(0.05)\n" + GOOD
    reqs = [request(0, code=held, timeout_s=60.0)] + [request(i) for i in range(1, N_FAST + 1)]
    await produce(run, prefix, [(b"one-partition", encode(r)) for r in reqs])

    async def fast_ones_out(_worker: Any) -> bool:
        return len(await results_by_request(run, prefix)) >= N_FAST

    await serve_in_process(run, prefix, fast_ones_out)  # then stopped with req-0 still held
    first = await results_by_request(run, prefix)
    assert first == Counter({f"req-{i}#0": 1 for i in range(1, N_FAST + 1)}), first
    offset, metadata = await _commit(run)
    assert answered.decode(offset, metadata) == set(range(offset + 1, offset + 1 + N_FAST))

    flag.unlink()

    async def all_out(_worker: Any) -> bool:
        return len(await results_by_request(run, prefix)) == N_FAST + 1

    # Its own dedup namespace: only the commit's metadata keeps it from answering again
    # (as after a crash between the commit and the dedup write).
    await serve_in_process(run, f"{prefix}-successor", all_out)
    final = await results_by_request(run, prefix)
    assert final == Counter({f"req-{i}#0": 1 for i in range(N_FAST + 1)}), final
    offset_after, metadata_after = await _commit(run)
    assert (offset_after, metadata_after) == (offset + N_FAST + 1, "")
