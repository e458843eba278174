"""The data-parallel learner (learner/parallel.py): 2 gloo ranks on the CPU reach the same
weights as one process trained on the same global batches; the pure parts (shard, pack)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors.torch import load_file

from learner.distributed import DistEnv
from learner.service import trainer
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
