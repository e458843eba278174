"""Executions/s and latency of a small python_tests job: job server vs docker exec vs no isolation.

One process, one run, the same job (a 2-line `add` and 3 tests), the same concurrency:

1. floor, naive: one plain `python3` per job that execs the solution and the tests in one
   process (no verdict protection at all: the cheapest possible way to run the job);
2. floor, executor: the real job server for one job as a plain subprocess, no container:
   the same verification, minus the isolation;
3. warm pool (docker exec): a one-shot job server `docker exec`-ed per job into long-lived
   hardened containers (the same isolation, paying an exec and a fresh interpreter per job);
4. its fixed cost: `docker exec true` alone;
5. warm pool (job server): the default; jobs over the attach stream of each container's
   long-lived job server, which forks pre-imported processes per job;
6. docker run: a fresh hardened container per job (create, start, attach, wait, remove).

Latency is per job, from submission to result. Throughput is jobs / wall time. CPU per job
is the whole machine's busy CPU time (/proc/stat) while the mode ran, divided by its jobs:
what a job costs on a machine whose cores are all in use. The modes run in interleaved
rounds, so on a shared machine each sees the same background load.

    .venv/bin/python benchmarks/sandbox.py [--n 200] [--n-run 40] [--rounds 5] [--concurrency 2]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.cpu import busy_cpu_s  # noqa: E402
from sandbox_workers.hardening import (  # noqa: E402
    SERVER_CAPS,
    SERVER_USER,
    Limits,
    container_kwargs,
)
from sandbox_workers.local import LocalRunner  # noqa: E402
from sandbox_workers.pool import SERVER_ARGV, ContainerPool, PoolConfig  # noqa: E402
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
        uid = slot.uid + 2  # a candidate uid of the container's block
        exec_id = api.exec_create(slot.id, ["true"], user=f"{uid}:{uid}")["Id"]
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

    server = shlex.join([*SERVER_ARGV, "--base-uid", "250000", "--once"])

    def run_once() -> bool:
        kwargs = container_kwargs(
            ref, Limits(), {"rollstream.bench": "1"}, user=SERVER_USER, caps=SERVER_CAPS
        )
        kwargs["environment"] = {**kwargs["environment"], "JOB": payload.decode()}
        argv = ["sh", "-c", f'printf "%s\\n" "$JOB" | exec {server}']
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
        self.cpu = 0.0
        self.ok = 0

    def row(self) -> dict[str, Any]:
        lat = sorted(self.latencies)
        n = len(lat)
        return {
            "n": n,
            "ok": self.ok,
            "rate": n / self.wall,
            "cpu_ms": self.cpu / max(n, 1) * 1000,
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

    t0, c0 = time.perf_counter(), busy_cpu_s()
    await asyncio.gather(*(timed() for _ in range(n)))
    stats.wall += time.perf_counter() - t0
    stats.cpu += busy_cpu_s() - c0


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
    exec_runner = ContainerPool(
        PoolConfig(image=image.image_ref(settings), size=c, transport="exec",
                   docker_endpoint=docker_engine.endpoint(settings))
    )  # fmt: skip
    await exec_runner.start()
    exec_pool = VerifyingSandbox(exec_runner, worker_id="bench-exec")
    modes: list[tuple[str, Callable[[], Awaitable[bool]], int]] = [
        ("floor: naive python3, no isolation", naive_job, n),
        ("floor: executor, no isolation", sandbox_job(local), n),
        ("warm pool (docker exec per job)", sandbox_job(exec_pool), n),
        ("  its fixed cost: docker exec true", exec_true_job(exec_pool), n),
        ("warm pool (job server)", sandbox_job(pool), n),
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
        await exec_pool.close()
        await local.close()
    rows = [(name, stats[name].row()) for name, _, _ in modes]
    print(f"python_tests job (add + 3 tests), concurrency {c}, {os.cpu_count()} CPUs, "
          f"{rounds} interleaved rounds")  # fmt: skip
    print(f"{'mode':<38} {'jobs':>5} {'ok':>5} {'exec/s':>8} {'p50 ms':>8} {'p95 ms':>8} "
          f"{'CPU ms':>7}")  # fmt: skip
    for name, r in rows:
        cells = [f"{r[k]:>8.1f}" for k in ("rate", "p50", "p95")] + [f"{r['cpu_ms']:>7.1f}"]
        print(f"{name:<38} {r['n']:>5} {r['ok']:>5} " + " ".join(cells))
    naive, floor = rows[0][1]["rate"], rows[1][1]["rate"]
    for label, row in (("docker exec", rows[2][1]), ("job server", rows[4][1])):
        print(f"warm pool ({label}) vs executor floor: {floor / row['rate']:.2f}x slower; "
              f"vs naive floor: {naive / row['rate']:.2f}x slower")  # fmt: skip
    js = rows[4][1]
    print(
        f"job server targets: within 3x of naive ({naive / js['rate']:.2f}x), "
        f"p50 <= 40 ms ({js['p50']:.1f}), p95 <= 100 ms ({js['p95']:.1f})"
    )
    if not all(r["ok"] == r["n"] for _, r in rows):
        sys.exit("a benchmark job did not pass: the figures above are not valid")


if __name__ == "__main__":
    asyncio.run(main())
