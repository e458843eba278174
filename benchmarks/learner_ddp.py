"""Data-parallel learner throughput: 1 process vs N ranks (learner/parallel.py), side by
side, on the same global batches.

    .venv/bin/python benchmarks/learner_ddp.py [--configs 1x1,1x2,2x1] [--steps 6]
                                               [--parallel ddp|fsdp]

A configuration PxT is P processes (P = 1: a plain Trainer; else rank 0 + followers over
gloo on the CPU, nccl on CUDA) of T torch threads each. Rank 0 times every `Trainer.step`
(for N ranks: sending the batch, the local micro-batches, the gradient all-reduce, the
optimizer step); after one warm-up step, tokens/s = sequence tokens of the global batch /
median step time. No Kafka: the compute ceiling of the training step.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

PROMPT, COMPLETION = 64, 192


def worker(args: argparse.Namespace) -> None:
    """One rank (or the single process): train, and on rank 0 print the step times."""
    from learner import distributed
    from learner.config import LearnerSettings
    from learner.parallel import DataParallelTrainer, follow
    from learner.sample import from_scored
    from learner.service import trainer
    from learner.synthetic import random_groups

    torch.set_num_threads(args.threads)
    section = LearnerSettings(batch_tokens=args.batch_tokens, micro_batch_tokens=args.micro,
                              parallel=args.parallel)  # fmt: skip
    t = trainer(section)
    if isinstance(t, DataParallelTrainer) and t.rank != 0:
        follow(t)
        distributed.shutdown()
        return
    per_batch = max(1, args.batch_tokens // (PROMPT + COMPLETION))
    gen = random_groups((args.steps + 1) * per_batch // 4 + 1, prompt_len=PROMPT,
                        completion_len=COMPLETION)  # fmt: skip
    data = [from_scored(m) for m in gen]
    times, tokens = [], 0
    for k in range(args.steps + 1):
        res = t.step(data[k * per_batch : (k + 1) * per_batch])
        if k:
            times.append(res.seconds)
        tokens = res.tokens
    if isinstance(t, DataParallelTrainer):
        t.channel.command(distributed.Op.STOP)
        distributed.shutdown()
    print(json.dumps({"times": times, "tokens": tokens, "device": str(t.device)}), flush=True)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run(nproc: int, threads: int, args: argparse.Namespace) -> dict[str, float | str]:
    cmd = [sys.executable, __file__, "--worker", "--threads", str(threads), "--steps",
           str(args.steps), "--parallel", args.parallel, "--batch-tokens",
           str(args.batch_tokens), "--micro", str(args.micro)]  # fmt: skip
    port, procs = str(_free_port()), []
    for rank in range(nproc):
        env = dict(os.environ, OMP_NUM_THREADS=str(threads), PYTHONPATH=str(ROOT))
        if nproc > 1:
            env.update(RANK=str(rank), WORLD_SIZE=str(nproc), LOCAL_RANK=str(rank),
                       MASTER_ADDR="127.0.0.1", MASTER_PORT=port)  # fmt: skip
        out = subprocess.PIPE if rank == 0 else subprocess.DEVNULL
        procs.append(subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.DEVNULL))
    try:
        stdout, _ = procs[0].communicate(timeout=args.timeout)
        for p in procs[1:]:
            p.wait(timeout=60)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    if procs[0].returncode != 0:
        raise SystemExit(f"{nproc} process(es): rank 0 failed ({procs[0].returncode})")
    got = json.loads(stdout.decode().strip().splitlines()[-1])
    median = statistics.median(got["times"])
    return {"nproc": nproc, "threads": threads, "step_s": median, "device": got["device"],
            "tokens_per_s": got["tokens"] / median, "tokens": got["tokens"],
            "spread": f"{min(got['times']):.2f}-{max(got['times']):.2f}"}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", default="1x1,1x2,2x1", help="PROCESSESxTHREADS, ...")
    parser.add_argument("--steps", type=int, default=6, help="timed steps (after 1 warm-up)")
    parser.add_argument("--parallel", default="ddp", choices=["ddp", "fsdp"])
    parser.add_argument("--threads", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--batch-tokens", type=int, default=8192)
    parser.add_argument("--micro", type=int, default=2048, help="micro_batch_tokens")
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    cpu = platform.processor() or platform.machine()
    print(f"# data-parallel learner: {cpu}, {os.cpu_count()} cores, torch {torch.__version__}; "
          f"tiny default model, global batch {args.batch_tokens} tokens of "
          f"{PROMPT}+{COMPLETION}-token samples, micro-batch {args.micro}, {args.parallel}, "
          f"median of {args.steps} steps\n")  # fmt: skip
    print("| processes | threads each | device | step s (median) | range s | tokens/s |")
    print("|---|---|---|---|---|---|")
    for config in args.configs.split(","):
        n, threads = (int(x) for x in config.split("x"))
        r = run(n, threads, args)
        print(f"| {r['nproc']} | {r['threads']} | {r['device']} | {r['step_s']:.3f} | "
              f"{r['spread']} | {r['tokens_per_s']:,.0f} |", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
