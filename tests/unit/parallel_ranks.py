"""One rank of a data-parallel training run for tests/unit/test_learner_parallel.py, or the
single-process reference: `python parallel_ranks.py OUT [--parallel ddp|fsdp]` under
RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT (rank 0 writes the final weights to OUT)."""

from __future__ import annotations

import argparse
import os
import sys

import torch
from safetensors.torch import save_file

from learner import distributed
from learner.checkpoint import CheckpointManager, CheckpointState
from learner.config import LearnerSettings
from learner.parallel import DataParallelTrainer, ReplicaCheckpoints, follow
from learner.sample import Sample, from_scored
from learner.service import trainer
from learner.synthetic import scored
from learner.trainer import Trainer

STEPS = 4


def section(parallel: str = "ddp", minibatches: int = 1) -> LearnerSettings:
    return LearnerSettings(
        tiny_dim=32,
        tiny_layers=2,
        tiny_heads=2,
        max_seq_len=96,
        lr=1e-3,
        micro_batch_tokens=160,
        minibatches=minibatches,
        entropy_coef=0.01,
        parallel=parallel,  # type: ignore[arg-type]
    )


def batches(steps: int = STEPS, per_batch: int = 11) -> list[list[Sample]]:
    """Global batches of varied lengths; every third sample a production trace."""
    out = []
    for b in range(steps):
        batch = []
        for i in range(per_batch):
            k = b * per_batch + i
            n = 8 + (k * 7) % 40
            logp = [-2.0 - 0.05 * j for j in range(n)] if k % 3 else None
            msg = scored([1 + k % 9, 2, 3, 4], [(5 * k + j) % 250 for j in range(n)],
                         advantage=(k % 5 - 2) / 2, logprobs=logp, group_id=f"g{k}")  # fmt: skip
            batch.append(from_scored(msg))
        out.append(batch)
    return out


def _checkpoints(t: Trainer, root: str) -> CheckpointManager:
    if isinstance(t, DataParallelTrainer):
        return ReplicaCheckpoints(root, t)
    return CheckpointManager(root)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--parallel", default="ddp")
    parser.add_argument("--minibatches", type=int, default=1)
    parser.add_argument("--batches", default=f"0:{STEPS}", help="which batches: FIRST:END")
    parser.add_argument("--resume", default=None, help="checkpoint dir to start from")
    parser.add_argument("--save", default=None, help="checkpoint dir to save to at the end")
    args = parser.parse_args()
    torch.set_num_threads(1)
    t = trainer(section(args.parallel, args.minibatches))
    if isinstance(t, DataParallelTrainer) and t.rank != 0:
        follow(t)
        distributed.shutdown()
        return 0
    first, end = (int(x) for x in args.batches.split(":"))
    if args.resume:
        assert _checkpoints(t, args.resume).load_latest(t.policy, t.optimizer)  # type: ignore[arg-type]
    for batch in batches()[first:end]:
        t.step(batch)
    if args.save:
        state = CheckpointState(version=0, step=t.steps)
        _checkpoints(t, args.save).save(state, t.policy, t.optimizer)  # type: ignore[arg-type]
    weights = t.weights()
    if isinstance(t, DataParallelTrainer):
        t.channel.command(distributed.Op.STOP)
        distributed.shutdown()
    save_file(weights, args.out)
    print(f"rank 0: {t.steps} steps", flush=True)
    return 0


if __name__ == "__main__":
    # Hard exit after the results are written, as the learner's ranks do: gloo's threads
    # can abort the interpreter's teardown ("terminate called without an active exception").
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
