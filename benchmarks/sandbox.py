"""Executions/s and latency of a small python_tests job: warm pool vs docker run vs no isolation.

One process, one run, the same job (a 2-line `add` and 3 tests), the same concurrency:

1. floor, naive: one plain `python3` per job that execs the solution and the tests in one
   process (no verdict protection at all: the cheapest possible way to run the job);
2. floor, executor: the real executor (deploy/sandbox/files/executor.py) as a plain
   subprocess, no container: the same verification, minus the isolation;
3. warm pool: the executor `docker exec`-ed into long-lived hardened containers;
4. docker run: a fresh hardened container per job (create, start, attach, wait, remove).

Latency is per job, from submission to result. Throughput is jobs / wall time. The modes
run in interleaved rounds, so on a shared machine each sees the same background load.

    .venv/bin/python benchmarks/sandbox.py [--n 200] [--n-run 40] [--rounds 5] [--concurrency 2]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sandbox_workers.hardening import Limits, container_kwargs  # noqa: E402
from sandbox_workers.local import LocalRunner  # noqa: E402
from sandbox_workers.sandbox import VerifyingSandbox  # noqa: E402
from schemas.sandbox import Outcome  # noqa: E402
from services.infra import docker_engine, image  # noqa: E402
from services.sandbox_wiring import docker_sandbox  # noqa: E402
from services.settings import Settings, load  # noqa: E402
from tests.unit.sandbox_programs import ADD_TESTS, GOOD, pt_request  # noqa: E402

NAIVE = (
    GOOD
    + ADD_TESTS.replace("from solution import add\n", "")
    + (
        "\nfor _n, _f in list(globals().items()):\n"
        "    if _n.startswith('test_'):\n        _f()\nprint('ok')\n"
    )
)


async def naive_job() -> bool:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-I", "-S", "-c", NAIVE, stdout=asyncio.subprocess.PIPE
    )
    out, _ = await proc.communicate()
    return proc.returncode == 0 and out.strip() == b"ok"


def sandbox_job(sandbox: VerifyingSandbox) -> Callable[[], Awaitable[bool]]:
    async def job() -> bool:
        r = await sandbox.run(pt_request(GOOD, ADD_TESTS))
        return r.outcome == Outcome.PASSED

    return job


def exec_true_job(pool: VerifyingSandbox) -> Callable[[], Awaitable[bool]]:
    """The fixed cost of the isolation: `docker exec /bin/true` in a warm pool container."""
    runner: Any = pool.runner
    slot = runner._idle._queue[0]

    def once() -> bool:
        api = runner._client.api
        exec_id = api.exec_create(slot.id, ["true"], user=f"{slot.uid}:{slot.uid}")["Id"]
        api.exec_start(exec_id)
        return bool(api.exec_inspect(exec_id)["ExitCode"] == 0)

    async def job() -> bool:
        return await asyncio.to_thread(once)

    return job


def docker_run_job(settings: Settings) -> Callable[[], Awaitable[bool]]:
    client = docker_engine.client(settings)
    ref = image.image_ref(settings)
    job = {
        "mode": "python_tests", "code": GOOD, "tests": ADD_TESTS, "timeout_s": 5.0,
        "memory_mb": 256, "output_limit": 1 << 20, "keep_output": 4096, "nproc": 32,
        "nofile": 128, "fsize_mb": 16,
    }  # fmt: skip
    payload = json.dumps(job).encode()

    def run_once() -> bool:
        kwargs = container_kwargs(ref, Limits(), {"rollstream.bench": "1"}, user="250000:250000")
        kwargs["environment"] = {**kwargs["environment"], "JOB": payload.decode()}
        argv = [
            "sh",
            "-c",
            'printf %s "$JOB" >/tmp/job && exec python3 -I -S /opt/rollstream/executor.py '
            "--container </tmp/job",
        ]
        container = client.containers.run(command=argv, detach=True, **kwargs)
        try:
            container.wait(timeout=60)
            out = container.logs(stdout=True, stderr=False).decode()
        finally:
            container.remove(force=True)
        events = [json.loads(ln) for ln in out.splitlines() if ln.startswith("{")]
        return any(e.get("outcome") == "passed" for e in events)

    async def one() -> bool:
        return await asyncio.to_thread(run_once)

    return one


class Stats:
    """Latencies and busy wall time of one mode, accumulated over rounds."""

    def __init__(self) -> None:
        self.latencies: list[float] = []
        self.wall = 0.0
        self.ok = 0

    def row(self) -> dict[str, Any]:
        lat = sorted(self.latencies)
        n = len(lat)
        return {
            "n": n,
            "ok": self.ok,
            "rate": n / self.wall,
            "p50": statistics.median(lat) * 1000,
            "p95": lat[max(0, int(0.95 * n) - 1)] * 1000,
        }


async def measure(job: Callable[[], Awaitable[bool]], n: int, conc: int, stats: Stats) -> None:
    """Run n jobs, conc at a time; add their latencies and the wall time to stats."""
    sem = asyncio.Semaphore(conc)

    async def timed() -> None:
        async with sem:
            t0 = time.perf_counter()
            passed = await job()
            stats.latencies.append(time.perf_counter() - t0)
            stats.ok += passed

    t0 = time.perf_counter()
    await asyncio.gather(*(timed() for _ in range(n)))
    stats.wall += time.perf_counter() - t0


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=200, help="jobs per mode")
    ap.add_argument("--n-run", type=int, default=40, help="jobs for the docker-run mode")
    ap.add_argument("--concurrency", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds of all modes")
    args = ap.parse_args()
    settings = load()
    settings = settings.model_copy(
        update={"sandbox": settings.sandbox.model_copy(update={"pool_size": args.concurrency})}
    )
    n, c, rounds = args.n, args.concurrency, args.rounds
    local = VerifyingSandbox(LocalRunner(concurrency=c))
    pool = await docker_sandbox(settings, "bench")
    modes: list[tuple[str, Callable[[], Awaitable[bool]], int]] = [
        ("floor: naive python3, no isolation", naive_job, n),
        ("floor: executor, no isolation", sandbox_job(local), n),
        ("warm pool (docker exec)", sandbox_job(pool), n),
        ("  its fixed cost: docker exec true", exec_true_job(pool), n),
        ("fresh docker run per job", docker_run_job(settings), args.n_run),
    ]
    stats = {name: Stats() for name, _, _ in modes}
    try:
        for _name, job, _ in modes:  # warm-up, not counted
            await asyncio.gather(*(job() for _ in range(c)))
        for _ in range(rounds):  # interleaved, so every mode sees the same background load
            for name, job, count in modes:
                await measure(job, max(1, count // rounds), c, stats[name])
    finally:
        await pool.close()
        await local.close()
    rows = [(name, stats[name].row()) for name, _, _ in modes]
    print(f"python_tests job (add + 3 tests), concurrency {c}, {os.cpu_count()} CPUs, "
          f"{rounds} interleaved rounds")  # fmt: skip
    print(f"{'mode':<38} {'jobs':>5} {'ok':>5} {'exec/s':>8} {'p50 ms':>8} {'p95 ms':>8}")
    for name, r in rows:
        cells = [f"{r[k]:>8.1f}" for k in ("rate", "p50", "p95")]
        print(f"{name:<38} {r['n']:>5} {r['ok']:>5} " + " ".join(cells))
    floor, warm = rows[1][1]["rate"], rows[2][1]["rate"]
    naive = rows[0][1]["rate"]
    print(f"warm pool vs executor floor: {floor / warm:.2f}x slower; vs naive floor: "
          f"{naive / warm:.2f}x slower (target: within 3x)")  # fmt: skip
    if not all(r["ok"] == r["n"] for _, r in rows):
        sys.exit("a benchmark job did not pass: the figures above are not valid")


if __name__ == "__main__":
    asyncio.run(main())
