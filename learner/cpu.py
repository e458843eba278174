"""What this CPU computes natively, and fast (pure reads, no torch state changed)."""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from pathlib import Path

import torch

log = logging.getLogger("rollstream.learner")

PROBE_SIZE = 768
"""Side of the square matmuls `fast_bf16_cpu` times (about 0.9 GFLOP each)."""
PROBE_ROUNDS = 3
"""Timed matmuls per dtype (after one untimed); the fastest counts."""
BF16_MARGIN = 0.8
"""bf16 is used only when its matmul takes at most this share of float32's time."""


def native_bf16_cpu(cpuinfo: str | None = None) -> bool:
    """Whether this CPU multiplies bf16 natively (avx512_bf16 or AMX), from /proc/cpuinfo's
    flags (``cpuinfo``: its text, for tests). oneDNN's own check
    (`_is_mkldnn_bf16_supported`, used where /proc/cpuinfo cannot be read) also says yes
    for plain AVX-512, where bf16 is emulated: on a 2-core Intel Xeon without avx512_bf16 a
    SmolLM2 forward+backward on 8 x 250 tokens took 29 s under bf16 autocast against 10 s in
    float32, and bf16 sampling was slower than float32 (benchmarks/generation.py)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            cpuinfo = ""
    if cpuinfo:
        flags = next((ln for ln in cpuinfo.splitlines() if ln.startswith("flags")), "").split()
        return "avx512_bf16" in flags or "amx_bf16" in flags
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


def bf16_pays(float32_s: float, bf16_s: float) -> bool:
    """Whether bf16 matmuls are worth using: at most BF16_MARGIN of float32's time."""
    return bf16_s <= BF16_MARGIN * float32_s


def matmul_seconds(dtype: torch.dtype, size: int = PROBE_SIZE, rounds: int = PROBE_ROUNDS) -> float:
    """The fastest of `rounds` size x size matmuls in `dtype` on this thread's torch threads."""
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(size, size, generator=gen).to(dtype)
    b = torch.randn(size, size, generator=gen).to(dtype)
    a @ b  # untimed: first-call set-up
    best = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - t0)
    return best


def bf16_measured_faster(timer: Callable[[torch.dtype], float] = matmul_seconds) -> bool:
    """Whether bf16 is the faster dtype on this CPU: native bf16 (`native_bf16_cpu`) and a
    matmul timed by `timer` (seconds per dtype) at most BF16_MARGIN of float32's time.
    Flags alone are not enough: on a 2-core Intel Xeon with avx512_bf16 (no AMX exposed) a
    bf16 matmul took twice float32's time, and a SmolLM2 forward+backward under bf16
    autocast 1.6x (benchmarks/train_step.py), where another such Xeon ran it 2.7x faster."""
    if not native_bf16_cpu():
        return False
    f32, bf16 = timer(torch.float32), timer(torch.bfloat16)
    pays = bf16_pays(f32, bf16)
    use = "bf16 where asked for (cpu_amp, sample_dtype auto)" if pays else "float32"
    log.info("bf16 matmul %.1f ms against float32 %.1f ms: %s", bf16 * 1e3, f32 * 1e3, use)
    return pays


@functools.cache
def fast_bf16_cpu() -> bool:
    """`bf16_measured_faster`, measured once per process (about 0.1 s) and remembered."""
    return bf16_measured_faster()
