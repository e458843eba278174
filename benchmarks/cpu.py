"""The machine's busy CPU time, for benchmarks that report how much of the machine a mode used."""

from __future__ import annotations

import os


def busy_cpu_s() -> float:
    """Seconds of CPU time the whole machine has spent busy (not idle or waiting on I/O)."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")
