"""What this CPU computes natively (pure reads, no torch state changed)."""

from __future__ import annotations

from pathlib import Path

import torch


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
