"""The data-parallel learner (learner/parallel.py): 2 gloo ranks on the CPU reach the same
weights as one process trained on the same global batches; the pure parts (shard, pack)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from learner import distributed
from learner.distributed import DistEnv
from learner.sample import Sample
from learner.service import trainer
from services.learner_launch import strip_nproc
from tests.unit import parallel_ranks

ROOT = Path(__file__).resolve().parents[2]
HELPER = Path(parallel_ranks.__file__)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _run(out: Path, world: int, *args: str) -> None:
    """Run the helper as `world` ranks (or one plain process), bounded in time."""
    port = str(_free_port())
    procs = []
    for rank in range(world):
        env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
        if world > 1:
            env.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
                       MASTER_ADDR="127.0.0.1", MASTER_PORT=port)  # fmt: skip
        cmd = [sys.executable, str(HELPER), str(out), *args]
        procs.append(subprocess.Popen(cmd, env=env, cwd=ROOT, stderr=subprocess.PIPE))
    try:
        for p in procs:
            _, err = p.communicate(timeout=240)
            assert p.returncode == 0, err.decode()[-3000:]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def _max_diff(a: Path, b: Path) -> float:
    wa, wb = load_file(a), load_file(b)
    assert wa.keys() == wb.keys()
    return max(float((wa[k].float() - wb[k].float()).abs().max()) for k in wa)


@pytest.mark.parametrize(("parallel", "minibatches"), [("ddp", 1), ("ddp", 2), ("fsdp", 1)])
def test_two_ranks_match_one_process(tmp_path: Path, parallel: str, minibatches: int) -> None:
    one, two = tmp_path / "one.safetensors", tmp_path / "two.safetensors"
    mb = ["--minibatches", str(minibatches)]
    _run(one, 1, *mb)
    _run(two, 2, "--parallel", parallel, *mb)
    diff = _max_diff(one, two)
    start = trainer(parallel_ranks.section(), DistEnv()).weights()
    moved = max(float((load_file(one)[k] - v).abs().max()) for k, v in start.items())
    print(f"\n{parallel} x2, minibatches {minibatches}, {parallel_ranks.STEPS} steps: "
          f"max abs weight difference vs one process {diff:.3g}")  # fmt: skip
    assert moved > 1e-3  # the steps did train
    assert diff <= 1e-5


@pytest.mark.parametrize("parallel", ["ddp", "fsdp"])
def test_checkpoint_of_two_ranks_resumes_exactly(tmp_path: Path, parallel: str) -> None:
    """2 steps, a checkpoint (fsdp: gathered), a new job resumes (broadcast to both ranks)
    for 2 more: the weights of 4 uninterrupted single-process steps."""
    one, two, ckpt = tmp_path / "one.st", tmp_path / "two.st", tmp_path / "ckpt"
    _run(one, 1)
    _run(tmp_path / "half.st", 2, "--parallel", parallel, "--batches", "0:2", "--save", str(ckpt))
    _run(two, 2, "--parallel", parallel, "--batches", "2:4", "--resume", str(ckpt))
    diff = _max_diff(one, two)
    print(f"\n{parallel} x2, 2 steps + checkpoint + 2 steps: max abs difference {diff:.3g}")
    assert diff <= 1e-5


def test_shard_is_balanced_deterministic_and_complete() -> None:
    lengths = [5, 30, 7, 8, 29, 6, 100, 12]
    parts = distributed.shard(lengths, 3)
    assert parts == distributed.shard(lengths, 3)
    assert sorted(i for p in parts for i in p) == list(range(len(lengths)))
    loads = sorted(sum(lengths[i] for i in p) for p in parts)
    assert loads == [47, 50, 100]  # the longest alone; the rest split evenly
    assert distributed.shard([4], 2) == [[0], []]


def test_pack_roundtrip() -> None:
    def sample(p: int, c: int, **kw: object) -> Sample:
        return Sample("id", "g", np.arange(1, p + 1, dtype=np.int32),
                      np.arange(10, 10 + c, dtype=np.int32), 0.5 * p, **kw)  # type: ignore[arg-type]  # fmt: skip

    samples = [
        sample(3, 4, behaviour_logp=np.linspace(-1, -2, 4, dtype=np.float32), reward=1.0),
        sample(2, 5),  # a production trace
        sample(
            4, 3, train_mask=np.array([True, False, True]), behaviour_logp=np.zeros(3, np.float32)
        ),
    ]
    back = distributed.unpack(distributed.pack(samples))
    for a, b in zip(samples, back, strict=True):
        assert (a.prompt == b.prompt).all() and (a.completion == b.completion).all()
        assert (a.advantage, a.reward, a.trained_tokens) == (
            b.advantage,
            b.reward,
            b.trained_tokens,
        )
        for x, y in ((a.behaviour_logp, b.behaviour_logp), (a.train_mask, b.train_mask)):
            assert (x is None and y is None) or (x is not None and y is not None and (x == y).all())
    assert distributed.unpack(distributed.pack([])) == []


def test_dist_env_and_launcher_arguments() -> None:
    assert DistEnv.from_env({}) == DistEnv(0, 1, 0) and not DistEnv.from_env({}).distributed
    env = DistEnv.from_env({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1"})
    assert env.distributed and not env.is_main and env.local_rank == 1
    with pytest.raises(ValueError, match="RANK=2"):
        DistEnv.from_env({"RANK": "2", "WORLD_SIZE": "2"})
    assert distributed.rank_device(torch.device("cuda"), env) == torch.device("cuda", 1)
    assert distributed.rank_device(torch.device("cpu"), env) == torch.device("cpu")
    argv = ["--set", "a=1", "learner", "--nproc", "2", "--idle-exit", "3", "--nproc=4"]
    assert strip_nproc(argv) == ["--set", "a=1", "learner", "--idle-exit", "3"]
