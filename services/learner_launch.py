"""`rollstream learner --nproc N`: the N ranks of a data-parallel learner on this host.

Starts `python -m services.cli <the same arguments, without --nproc>` N times with
torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR
127.0.0.1, MASTER_PORT a free port), so a rank cannot tell it from torchrun. SIGTERM/SIGINT
go to rank 0, which stops cleanly (final publication and checkpoint) and then stops the
others (learner/parallel.py). When a rank fails, the others are killed: no rank outlives
the job, and the exit status is the first failure's.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from types import FrameType

GRACE_S = 60.0
"""How long the other ranks get to end after rank 0 ended (or failed)."""


def strip_nproc(argv: Sequence[str]) -> list[str]:
    """`argv` without `--nproc N` / `--nproc=N`."""
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg == "--nproc":
            skip = True
        elif not arg.startswith("--nproc="):
            out.append(arg)
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _env(rank: int, nproc: int, port: int) -> dict[str, str]:
    return dict(
        os.environ,
        RANK=str(rank),
        WORLD_SIZE=str(nproc),
        LOCAL_RANK=str(rank),
        LOCAL_WORLD_SIZE=str(nproc),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )


def launch(nproc: int, argv: Sequence[str]) -> int:
    """Run the ranks until they end; the job's exit status."""
    port = _free_port()
    cmd = [sys.executable, "-m", "services.cli", *strip_nproc(argv)]
    procs = [subprocess.Popen(cmd, env=_env(r, nproc, port)) for r in range(nproc)]

    def forward(sig: int, _frame: FrameType | None) -> None:
        if procs[0].poll() is None:
            procs[0].send_signal(sig)

    old = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        return _supervise(procs)
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def _supervise(procs: list[subprocess.Popen[bytes]]) -> int:
    deadline: float | None = None
    while True:
        codes = [p.poll() for p in procs]
        failed = [c for c in codes if c not in (None, 0)]
        if failed:
            return failed[0] or 1
        if all(c == 0 for c in codes):
            return 0
        if codes[0] is not None and deadline is None:
            deadline = time.monotonic() + GRACE_S
        if deadline is not None and time.monotonic() > deadline:
            return 1  # rank 0 ended, another rank did not: killed by launch()
        time.sleep(0.2)
