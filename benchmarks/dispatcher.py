"""Throughput and latency of the reward dispatcher, next to a plain aiokafka floor.

Three runs on the local stack, each on a fresh topic prefix, in one process:

1. floor: a plain aiokafka loop (consume trajectories, decode, produce a reward) on the
   same topics: the cost of Kafka and the codec alone;
2. dispatcher with an in-process verifier (`exact`): the stream processor's overhead
   (faust, group table, exactly-once transactions);
3. dispatcher with the sandbox tier (`python_tests` in the warm Docker pool).

4. dispatcher at a sustained load of half its capacity (the rate run 2 measured), paced
   evenly for `--sustain-s` seconds: the latency of a dispatcher that keeps up.

Sustained rate = records / (last reward seen - first trajectory sent). Latency = the
moment the reward is read minus the trajectory's created_at (the same clock). Ratios are
to the floor of the same run (the machine is shared: compare within one run only).

    .venv/bin/python benchmarks/dispatcher.py [--n 2000] [--n-sandbox 200] [--sustain-s 20]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

import msgspec

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "integration"))

from dispatch_helpers import GOOD, HALF, Service, group_of, service_env  # noqa: E402

from schemas import codec, topics  # noqa: E402
from schemas.messages import ScoredTrajectory, Trajectory  # noqa: E402
from schemas.sandbox import Outcome  # noqa: E402
from services import topics as topic_admin  # noqa: E402
from services.settings import Settings, load  # noqa: E402


def run_settings(prefix: str) -> Settings:
    s = load()
    return s.model_copy(update={"topics": s.topics.model_copy(update={"prefix": prefix})})


def make(n: int, sandbox: bool) -> list[Trajectory]:
    out: list[Trajectory] = []
    for g in range(n // 8):
        completions = [GOOD, HALF] * 4 if sandbox else ["42", "41"] * 4
        out += group_of(f"task{g % 9}", f"g{g}-{uuid.uuid4().hex[:6]}", completions, sandbox)
    return out


async def send_all(settings: Settings, trajs: list[Trajectory], rate: float = 0.0) -> float:
    """Publish `trajs` (a burst, or paced at `rate` per second, a group at a time, each
    stamped when it is sent); returns when the first was sent."""
    from aiokafka import AIOKafkaProducer

    producer = AIOKafkaProducer(bootstrap_servers=settings.kafka.endpoint, linger_ms=5)
    await producer.start()
    t0 = time.time()
    try:
        name = topics.TRAJECTORIES.full_name(settings.topics.prefix)
        futures = []
        for i, t in enumerate(trajs):
            if rate > 0 and i % 8 == 0:
                await asyncio.sleep(max(0.0, t0 + i / rate - time.time()))
            if rate > 0:
                t.created_at = time.time()
            futures.append(await producer.send(name, codec.encode(t), key=t.group_id.encode()))
        await asyncio.gather(*futures)
    finally:
        await producer.stop()
    return t0


class _Created(msgspec.Struct):
    created_at: float


class _Reward(msgspec.Struct):
    """The one field of a ScoredTrajectory the reader needs (the rest is skipped)."""

    trajectory: _Created


_REWARD = msgspec.msgpack.Decoder(_Reward)


async def read_rewards(settings: Settings, n: int, timeout_s: float) -> tuple[list[float], float]:
    """Latencies (s) of the first n rewards read (read_committed), and when the last was
    published. Latency = the reward record's timestamp (when its producer sent it) minus
    its trajectory's created_at, so a reader that falls behind on this shared machine does
    not count against the system measured."""
    from aiokafka import AIOKafkaConsumer

    consumer = AIOKafkaConsumer(
        topics.REWARDS.full_name(settings.topics.prefix),
        bootstrap_servers=settings.kafka.endpoint,
        auto_offset_reset="earliest",
        isolation_level="read_committed",
    )
    await consumer.start()
    lat: list[float] = []
    last = time.time()
    deadline = time.monotonic() + timeout_s
    try:
        while len(lat) < n and time.monotonic() < deadline:
            batch = await consumer.getmany(timeout_ms=200)
            for records in batch.values():
                for r in records:
                    sent = r.timestamp / 1000.0
                    lat.append(sent - _REWARD.decode(r.value).trajectory.created_at)
                    last = max(last, sent) if lat[:-1] else sent
    finally:
        await consumer.stop()
    return lat, last


async def floor_loop(settings: Settings, stop: asyncio.Event) -> None:
    """The physical floor: consume, decode, produce a reward; no state, no transactions."""
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

    p = settings.topics.prefix
    consumer = AIOKafkaConsumer(
        topics.TRAJECTORIES.full_name(p),
        bootstrap_servers=settings.kafka.endpoint,
        group_id=f"{p}-floor",
        auto_offset_reset="earliest",
    )
    producer = AIOKafkaProducer(bootstrap_servers=settings.kafka.endpoint, acks="all")
    await consumer.start()
    await producer.start()
    try:
        while not stop.is_set():
            batch = await consumer.getmany(timeout_ms=100)
            for records in batch.values():
                for r in records:
                    traj = codec.decode(r.value, Trajectory)
                    scored = ScoredTrajectory(trajectory=traj, reward=0.0, outcome=Outcome.PASSED)
                    await producer.send(
                        topics.REWARDS.full_name(p), codec.encode(scored), key=r.key
                    )
    finally:
        await consumer.stop()
        await producer.stop()


def summary(name: str, t0: float, lat: list[float], last: float) -> dict[str, object]:
    if not lat:
        return {"run": name, "n": 0, "rate": 0.0, "p50": float("nan"), "p95": float("nan")}
    wall = max(last - t0, 1e-9)
    q = statistics.quantiles(lat, n=20) if len(lat) >= 20 else [max(lat)] * 19
    return {
        "run": name,
        "n": len(lat),
        "rate": len(lat) / wall,
        "p50": statistics.median(lat),
        "p95": q[18],
    }


async def bench_floor(n: int) -> dict[str, object]:
    settings = run_settings(f"bench-floor-{uuid.uuid4().hex[:6]}")
    await topic_admin.ensure(settings)
    stop = asyncio.Event()
    task = asyncio.create_task(floor_loop(settings, stop))
    await asyncio.sleep(3)  # consumer group join
    trajs = make(n, sandbox=False)
    t0 = await send_all(settings, trajs)
    lat, last = await read_rewards(settings, len(trajs), 120)
    stop.set()
    await task
    return summary("plain aiokafka loop (floor)", t0, lat, last)


async def bench_dispatcher(
    n: int, sandbox: bool, log_dir: Path, rate: float = 0.0
) -> dict[str, object]:
    prefix = f"bench-disp-{uuid.uuid4().hex[:6]}"
    settings = run_settings(prefix)
    await topic_admin.ensure(settings)
    services = []
    if sandbox:
        services.append(Service(["sandbox-worker"], service_env(prefix), log_dir / "w.log"))
    services.append(Service(["dispatcher"], service_env(prefix), log_dir / "d.log"))
    for svc in services:
        svc.start()
    try:
        # Warm-up group: wait until the pipeline answers before timing.
        warm = make(8, sandbox)
        await send_all(settings, warm)
        await read_rewards(settings, len(warm), 120)
        trajs = make(n, sandbox)
        reader = asyncio.create_task(read_rewards(settings, len(warm) + len(trajs), 600))
        t0 = await send_all(settings, trajs, rate)
        lat, last = await reader
        lat = lat[len(warm) :]
    finally:
        for svc in services:
            svc.stop()
    name = "dispatcher + sandbox (python_tests)" if sandbox else "dispatcher, in-process verifier"
    if rate:
        name = f"dispatcher at {rate:.0f}/s (half capacity)"
    return summary(name, t0, lat, last)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=2000, help="trajectories (in-process runs)")
    parser.add_argument("--n-sandbox", type=int, default=200, help="trajectories (sandbox run)")
    parser.add_argument("--sustain-s", type=float, default=20.0, help="half-capacity run (0: skip)")
    parser.add_argument("--repeat", type=int, default=1, help="floor/dispatcher pairs (median)")
    args = parser.parse_args()

    async def go() -> list[dict[str, object]]:
        rows: list[dict[str, object]] = []
        with tempfile.TemporaryDirectory() as tmp:
            for _ in range(args.repeat):  # floor and dispatcher alternate: same conditions
                rows.append(await bench_floor(args.n))
                rows.append(await bench_dispatcher(args.n, False, Path(tmp)))
            capacity = statistics.median(float(r["rate"]) for r in rows[1::2])  # type: ignore[arg-type]
            if args.sustain_s > 0 and capacity > 0:
                half = capacity / 2
                n = max(8, int(half * args.sustain_s) // 8 * 8)
                rows.append(await bench_dispatcher(n, False, Path(tmp), rate=half))
            if args.n_sandbox > 0:
                rows.append(await bench_dispatcher(args.n_sandbox, True, Path(tmp)))
        return rows

    rows = asyncio.run(go())
    print(f"{'run':<40} {'n':>6} {'traj/s':>9} {'x floor':>8} {'p50 ms':>9} {'p95 ms':>9}")
    floor = 0.0
    for r in rows:
        if str(r["run"]).startswith("plain"):
            floor = float(r["rate"])  # type: ignore[arg-type]
        ratio = float(r["rate"]) / floor if floor else float("nan")  # type: ignore[arg-type]
        print(
            f"{r['run']:<40} {r['n']:>6} {float(r['rate']):>9.1f} {ratio:>8.3f} "  # type: ignore[arg-type]
            f"{1000 * float(r['p50']):>9.0f} {1000 * float(r['p95']):>9.0f}"  # type: ignore[arg-type]
        )
    rates = [float(r["rate"]) for r in rows]  # type: ignore[arg-type]
    pairs = [rates[2 * i + 1] / rates[2 * i] for i in range(args.repeat) if rates[2 * i]]
    print(
        f"dispatcher / floor, per pair: {' '.join(f'{x:.3f}' for x in pairs)}; "
        f"median {statistics.median(pairs):.3f}"
    )


if __name__ == "__main__":
    main()
