"""(a) of benchmarks/pipeline.py: the demo's pipeline (services as processes: feeder,
generator, reward dispatcher, sandbox worker, learner over Kafka) for `--minutes`.

Beside it, a snapshotter fetches the newest announced weights every `eval_every_s`
seconds, for the held-out curve (evaluated after the run, off the clock).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from typing import Any

from rich.console import Console

from services.settings import Settings


async def _snapshots(demo: Any, every_s: float, out: list[tuple[float, Any, int]]) -> None:
    from learner.weights import fetch
    from schemas import codec, topics
    from schemas.learning import WeightUpdate
    from services.learner_kafka import last_value

    s = demo.s
    topic, key = topics.WEIGHTS.full_name(s.topics.prefix), s.learner.policy.encode()
    seen = -1
    while True:
        await asyncio.sleep(every_s)
        if not demo.started or demo.stopped:
            continue
        t = time.monotonic() - demo.started
        raw = await last_value(s, topic, key, timeout_s=10)
        if raw is None:
            continue
        update = codec.decode(raw, WeightUpdate)
        if update.version == seen:
            continue
        with contextlib.suppress(Exception):  # pruned from the store meanwhile: next one
            state = await asyncio.to_thread(
                fetch, update.uri, update.sha256, redis_url=s.redis.endpoint
            )
            out.append((t, state, update.version))
            seen = update.version


async def async_run(
    s: Settings, state: dict[str, Any], console: Console, eval_every_s: float, minutes: float
) -> dict[str, Any]:
    """The demo with `demo.budget_minutes` = `minutes` plus a start-up allowance."""
    from services.demo import Demo

    demo = Demo(s, console)
    demo.initial_state = state
    snaps: list[tuple[float, Any, int]] = [(0.0, state, 0)]  # (seconds, weights, version)
    taker = asyncio.create_task(_snapshots(demo, eval_every_s, snaps))
    try:
        rc = await demo.run()
    finally:
        taker.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await taker
    if rc != 0:
        raise RuntimeError(f"the asynchronous run failed (exit {rc}); see {demo.dir}/logs")
    return _measured(demo, snaps, minutes * 60)


def _measured(demo: Any, snaps: list[tuple[float, Any, int]], span_s: float) -> dict:
    """The run from the moment the services were up (the last snapshot row before the
    first trajectory: start-up of the processes is not counted, as the sync loop does not
    count its sandbox pool's) for `span_s` seconds; times relative to that moment."""
    first = next((i for i, r in enumerate(demo.rows) if r.trajectories > 0), 0)
    t_ready = demo.rows[max(0, first - 1)].t if demo.rows else 0.0
    end = t_ready + span_s
    rows = [r for r in demo.rows if t_ready <= r.t <= end + 1]
    times: list[float] = []
    for a, b in itertools.pairwise(rows):
        times += [b.t - t_ready] * max(0, b.scored - a.scored)
    log: list[tuple[float, float]] = []
    for m, (total, n) in sorted(demo.stats.per_minute.items()):
        if t_ready <= m * 60 + 30 <= end:
            log += [(m * 60 + 30.0 - t_ready, total / n)] * int(n)
    stale = sum(n for k, n in demo.stats.drop_reasons.items() if "stale" in k)
    kept = [(max(0.0, t - t_ready), st, v) for t, st, v in snaps if t <= end + 1]
    kept = [kept[0]] + [x for x in kept[1:] if x[0] > 0]
    return {
        "mode": "async", "log": log, "seconds": min(span_s, rows[-1].t - t_ready if rows else 0),
        "snapshots": [(t, st) for t, st, _ in kept], "snapshot_steps": [v for *_, v in kept],
        "times": times,
        "samples": (rows[-1].scored - rows[0].scored) if rows else 0, "stale_drops": stale,
        "settled": len(demo.stats.ledger), "drop_reasons": dict(demo.stats.drop_reasons),
        "trained": sum(st == "trained" for st in demo.stats.ledger.values()),
        "steps": demo.final_version, "startup_s": t_ready,
        "flat_groups": demo.stats.groups_flat / max(1, demo.stats.groups_done),
        "all_failed": demo.stats.groups_failed / max(1, demo.stats.groups_done),
        "all_passed": demo.stats.groups_passed / max(1, demo.stats.groups_done),
    }  # fmt: skip
