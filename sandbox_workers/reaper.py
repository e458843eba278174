"""Finds sandbox containers whose owning process is gone, and removes them.

Every pool container carries `rollstream.sandbox.owner = host:pid:starttime` (the start
time, in clock ticks since boot, tells a live owner from a reused pid). A worker that dies
without closing its pool (SIGKILL, OOM, power) leaves its containers; the next pool started
on that host removes them, and so do `rollstream down` and `rollstream sandbox reap`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
from typing import Any, Final

from sandbox_workers.hardening import SANDBOX_LABEL

OWNER_LABEL: Final = "rollstream.sandbox.owner"
POOL_LABEL: Final = "rollstream.sandbox.pool"
UID_LABEL: Final = "rollstream.sandbox.uid"

log = logging.getLogger("rollstream.sandbox.reaper")


def _start_time(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]  # field 22 (starttime), after "comm"


def owner_token(pid: int | None = None) -> str:
    """This process as an owner label value."""
    pid = os.getpid() if pid is None else pid
    return f"{socket.gethostname()}:{pid}:{_start_time(pid) or '?'}"


def owner_alive(token: str) -> bool | None:
    """Whether the owner named by `token` still runs; None when it is on another host or the
    token is not ours to judge."""
    host, _, rest = token.partition(":")
    pid_text, _, start = rest.partition(":")
    if host != socket.gethostname() or not pid_text.isdigit():
        return None
    return _start_time(int(pid_text)) == start


def reap_orphans(client: Any) -> int:
    """Remove the sandbox containers of dead owners on this host; how many were removed."""
    removed = 0
    # the low-level list: the high-level one inspects every container, and fails when one
    # of them is removed meanwhile (by its pool, or by another worker's reaper)
    for container in client.api.containers(all=True, filters={"label": SANDBOX_LABEL}):
        token = (container.get("Labels") or {}).get(OWNER_LABEL)
        if token is None or owner_alive(token) is not False:
            continue
        with contextlib.suppress(Exception):
            client.api.remove_container(container["Id"], force=True)
            removed += 1
    if removed:
        log.warning("removed %d sandbox containers left behind by dead workers", removed)
    return removed
