"""Learner throughput and weight publication latency, on the local stack.

    .venv/bin/python benchmarks/learner.py [--steps 30] [--sizes 1,10,100] [--repeats 3]
    .venv/bin/python benchmarks/learner.py --model smollm2   # weight sync at that size

1. Throughput. The trainer alone (no Kafka: the compute ceiling), then the learner service
   reading a backlog of ScoredTrajectory records produced in advance to a fresh prefix (a
   stream faster than it trains), publishing every step and checkpointing every 10.
   tokens/s = sequence tokens trained / time in training steps; wait = share of wall time
   spent polling Kafka for data; other = decoding, bookkeeping, ledger.
2. Weight publication -> fetch for built-in transformers of about 1M, 10M and 100M
   parameters (float32), through each WeightStore: put (safetensors + sha256 + write),
   the WeightUpdate announced on `weights` until a consumer reads it, get (read + verify
   sha256 + deserialize), load into a second model. Median of --repeats.
"""

from __future__ import annotations

import argparse
import asyncio
import platform
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from learner.sample import Sample, from_scored
from learner.spec import make_policy
from learner.synthetic import random_groups
from learner.tiny import TinyConfig, TinyPolicy
from learner.trainer import Trainer, pick_device, train_config
from learner.weights import DirWeightStore, RedisWeightStore, WeightStore
from schemas import codec, topics
from schemas.messages import WeightUpdate
from services.learner_service import run_service
from services.models import resolved
from services.settings import Settings, load

PROMPT, COMPLETION = 64, 192
SIZES = {1: (160, 3), 10: (384, 5), 100: (768, 14)}  # millions -> (dim, layers)


def _settings(prefix: str, tmp: Path, store: str) -> Settings:
    return load(
        [
            f"topics.prefix={prefix}",
            f"learner.checkpoint_dir={tmp / 'ckpt'}",
            f"learner.weight_dir={tmp / 'weights'}",
            f"learner.weight_store={store}",
            "learner.batch_tokens=8192",
            "learner.micro_batch_tokens=8192",
            "learner.checkpoint_every=10",
            "learner.max_lag=1000000",
            "learner.tensorboard=false",
        ]
    )


def _samples(n_groups: int) -> list[Sample]:
    gen = random_groups(n_groups, group_size=4, prompt_len=PROMPT, completion_len=COMPLETION)
    return [from_scored(m) for m in gen]


def bench_trainer(settings: Settings, steps: int) -> dict[str, float]:
    ls = settings.learner
    trainer = Trainer(make_policy(resolved(settings)), train_config(ls), pick_device(ls.device))
    per_batch = ls.batch_tokens // (PROMPT + COMPLETION)
    data = _samples(per_batch * (steps + 1) // 4 + 1)
    trainer.step(data[:per_batch])  # warm-up
    tokens, seconds = 0, 0.0
    for k in range(1, steps + 1):
        res = trainer.step(data[k * per_batch % len(data) :][:per_batch] or data[:per_batch])
        tokens, seconds = tokens + res.tokens, seconds + res.seconds
    return {"tokens_per_s": tokens / seconds, "step_s": seconds / steps}


async def _produce(settings: Settings, records: list[tuple[bytes, bytes]]) -> None:
    from aiokafka import AIOKafkaProducer

    producer = AIOKafkaProducer(bootstrap_servers=settings.kafka.endpoint, acks="all", linger_ms=5)
    await producer.start()
    try:
        topic = topics.REWARDS.full_name(settings.topics.prefix)
        futures = [await producer.send(topic, v, key=k) for k, v in records]
        await asyncio.gather(*futures)
    finally:
        await producer.stop()


async def bench_service(settings: Settings, steps: int) -> dict[str, float]:
    from services import topics as admin

    await admin.ensure(settings)
    per_batch = settings.learner.batch_tokens // (PROMPT + COMPLETION)
    groups = per_batch * (steps + 2) // 4
    msgs = list(random_groups(groups, prompt_len=PROMPT, completion_len=COMPLETION, seed=1))
    await _produce(settings, [(m.group_id.encode(), codec.encode(m)) for m in msgs])
    summary = await run_service(settings, max_steps=steps, max_seconds=600)
    w = summary.wall_s
    other = w - summary.wait_s - summary.train_s - summary.publish_s - summary.checkpoint_s
    return {
        "steps": summary.steps,
        "tokens_per_s": summary.tokens_per_s,
        "wall_tokens_per_s": summary.tokens / summary.wall_s,
        "wait_frac": summary.wait_frac,
        "train_frac": summary.train_s / w,
        "publish_frac": summary.publish_s / w,
        "checkpoint_frac": summary.checkpoint_s / w,
        "other_frac": other / w,
        "restore_s": summary.restore_s,
    }


class Announcer:
    """Produce a WeightUpdate and time until a consumer of `weights` reads it."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.topic = topics.WEIGHTS.full_name(settings.topics.prefix)

    async def __aenter__(self) -> Announcer:
        from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

        self.producer = AIOKafkaProducer(bootstrap_servers=self.settings.kafka.endpoint, acks="all")
        self.consumer = AIOKafkaConsumer(bootstrap_servers=self.settings.kafka.endpoint)
        await self.producer.start()
        await self.consumer.start()
        from services.kafka import partitions

        tps = [TopicPartition(self.topic, p) for p in await partitions(self.settings, self.topic)]
        self.consumer.assign(tps)
        await self.consumer.seek_to_end(*tps)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.producer.stop()
        await self.consumer.stop()

    async def announce(self, update: WeightUpdate) -> WeightUpdate:
        await self.producer.send_and_wait(self.topic, codec.encode(update), key=b"bench")
        async with asyncio.timeout(30):
            while True:
                for msgs in (await self.consumer.getmany(timeout_ms=200)).values():
                    for m in msgs:
                        got = codec.decode(m.value, WeightUpdate)
                        if got.id == update.id:
                            return got


async def bench_publish(
    settings: Settings, store: WeightStore, size_m: int, repeats: int
) -> dict[str, float]:
    dim, layers = SIZES[size_m]
    cfg = TinyConfig(dim=dim, layers=layers, heads=8, max_seq_len=1024)
    src, dst = TinyPolicy(cfg), TinyPolicy(cfg)
    params = sum(p.numel() for p in src.parameters())
    times: dict[str, list[float]] = {"put": [], "announce": [], "get": [], "load": []}
    size = 0
    async with Announcer(settings) as ann:
        for version in range(repeats):
            t0 = time.perf_counter()
            ref = await asyncio.to_thread(store.put, version, src.weights())
            t1 = time.perf_counter()
            update = WeightUpdate(policy="bench", version=version, step=version, uri=ref.uri,
                                  sha256=ref.sha256, size_bytes=ref.size_bytes)  # fmt: skip
            got = await ann.announce(update)
            t2 = time.perf_counter()
            state = await asyncio.to_thread(store.get, got.uri, got.sha256)
            t3 = time.perf_counter()
            dst.load_weights(state)
            t4 = time.perf_counter()
            for key, value in zip(times, (t1 - t0, t2 - t1, t3 - t2, t4 - t3), strict=True):
                times[key].append(value)
            size = ref.size_bytes
            del state
    out = {k: statistics.median(v) for k, v in times.items()}
    out["total"] = sum(out.values())
    out["params_m"] = params / 1e6
    out["mb"] = size / 1e6
    return out


async def main_async(args: argparse.Namespace) -> None:
    torch.set_num_threads(args.threads)
    prefix = f"bench{uuid.uuid4().hex[:8]}"
    tmp = Path(tempfile.mkdtemp(prefix="rollstream-bench-"))
    settings = _settings(prefix, tmp, "redis")
    device = pick_device(settings.learner.device)
    cpu = platform.processor() or platform.machine()
    threads = torch.get_num_threads()
    print(f"# learner benchmark: {cpu}, torch {torch.__version__}, {threads} threads, {device}")
    ls = settings.learner
    params = sum(p.numel() for p in make_policy(resolved(settings)).trainable_parameters()) / 1e6
    print(f"model: tiny dim {ls.tiny_dim} x {ls.tiny_layers} layers ({params:.2f}M params); "
          f"batch {ls.batch_tokens} tokens of {PROMPT}+{COMPLETION}-token samples")  # fmt: skip
    try:
        t = bench_trainer(settings, args.steps)
        print(f"\n## throughput ({args.steps} steps)\n")
        print("| run | tokens/s (training) | tokens/s (wall) | waiting for data | training "
              "| publishing | checkpoints | other |")  # fmt: skip
        print("|---|---|---|---|---|---|---|---|")
        print(f"| trainer only | {t['tokens_per_s']:,.0f} | - | - | - | - | - | - |")
        s = await bench_service(settings, args.steps)
        fracs = " | ".join(
            f"{s[k]:.1%}" for k in ("wait_frac", "train_frac", "publish_frac", "checkpoint_frac")
        )
        print(f"| service, backlog on Kafka | {s['tokens_per_s']:,.0f} | "
              f"{s['wall_tokens_per_s']:,.0f} | {fracs} | {s['other_frac']:.1%} |")  # fmt: skip
        print(f"\n(service start-up, not in wall time: {s['restore_s']:.2f} s)")
        await publish_table(settings, tmp, args)
    finally:
        await cleanup(settings, prefix, tmp)


async def publish_table(settings: Settings, tmp: Path, args: argparse.Namespace) -> None:
    print("\n## weight publication -> fetch (median seconds)\n")
    print("| store | params | blob MB | put | announce | get+verify | load | total |")
    print("|---|---|---|---|---|---|---|---|")
    for size in [int(x) for x in args.sizes.split(",")]:
        namespace = f"rollstream:{settings.topics.prefix}:weights"
        stores: dict[str, Any] = {
            "redis": RedisWeightStore.from_url(
                settings.redis.endpoint, "bench", namespace=namespace, keep=1
            ),
            "dir": DirWeightStore(tmp / "bench-weights", "bench", keep=1),
        }
        for name, store in stores.items():
            r = await bench_publish(settings, store, size, args.repeats if size < 100 else 2)
            print(f"| {name} | {r['params_m']:.1f}M | {r['mb']:.0f} | {r['put']:.3f} | "
                  f"{r['announce']:.3f} | {r['get']:.3f} | {r['load']:.3f} | {r['total']:.3f} |",
                  flush=True)  # fmt: skip
        stores["redis"].r.close()


async def cleanup(settings: Settings, prefix: str, tmp: Path) -> None:
    import redis

    client = redis.Redis.from_url(settings.redis.endpoint)
    keys = list(client.scan_iter(f"rollstream:{prefix}:*", count=1000))
    if keys:
        client.delete(*keys)
    client.close()
    shutil.rmtree(tmp, ignore_errors=True)
    from aiokafka.admin import AIOKafkaAdminClient

    admin = AIOKafkaAdminClient(bootstrap_servers=settings.kafka.endpoint)
    await admin.start()
    try:
        ours = [t for t in await admin.list_topics() if t.startswith(prefix + ".")]
        if ours:
            await admin.delete_topics(ours)
    finally:
        await admin.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--sizes", default="1,10,100", help="model sizes in millions")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--model", default="tiny", help="smollm2: benchmarks/weight_sync.py")
    args = parser.parse_args()
    if args.model != "tiny":
        from benchmarks import weight_sync

        weight_sync.run(args.model, args.repeats, args.threads)
        return
    asyncio.run(main_async(args))


if __name__ == "__main__":
    main()
