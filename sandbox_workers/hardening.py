"""The hardened container profile every sandbox runs under (DESIGN.md section 4).

No network, all capabilities dropped, no-new-privileges, read-only root with a
size-capped tmpfs, non-root user, pids/memory(=memory+swap)/CPU limits, ulimits, init,
and the `rollstream.sandbox` label the reaper looks for.

Two uids per container: the container's own processes (init and an idle keeper) run as
SANDBOX_USER; jobs are `docker exec`-ed under a uid of the container's own, drawn from
JOB_UIDS, so a job can signal nothing but itself, and RLIMIT_NPROC (counted per uid by the
kernel, across containers) bounds that one container only. The IPC sysctls leave a job no
System V or POSIX message-queue object that could outlive it into the next job.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

SANDBOX_LABEL: Final = "rollstream.sandbox"
SANDBOX_USER: Final = "10001:10001"
JOB_UIDS: Final = range(200_000, 300_000)
"""Per-container job uids (no passwd entry needed; never shared by two live containers)."""
IPC_SYSCTLS: Final = {
    "kernel.shmmax": "0",
    "kernel.shmall": "0",
    "kernel.msgmni": "0",
    "kernel.sem": "0 0 0 0",
    "fs.mqueue.queues_max": "0",
}


@dataclass(frozen=True, slots=True)
class Limits:
    """Resource limits of one sandbox container."""

    memory_mb: int = 512
    """Memory limit; swap is set equal, so memory+swap cannot exceed it."""
    cpus: float = 1.0
    """CPU quota in cores."""
    pids: int = 64
    """Max processes and threads in the container (fork bombs stop here)."""
    tmpfs_mb: int = 64
    """Size of the writable scratch tmpfs (/work and /tmp)."""
    nofile: int = 256
    """Max open files per process."""
    fsize_mb: int = 32
    """Max size of a file a process may write."""
    shm_mb: int = 16
    """Size of /dev/shm (POSIX shared memory and semaphores)."""


def container_kwargs(
    image: str, limits: Limits, labels: dict[str, str] | None = None, user: str = SANDBOX_USER
) -> dict[str, Any]:
    """Keyword arguments for docker-py `containers.run/create` that apply the profile."""
    import docker.types

    mem = f"{limits.memory_mb}m"
    tmpfs_opts = f"rw,nosuid,nodev,noexec,size={limits.tmpfs_mb}m,mode=1777"
    return {
        "image": image,
        "user": user,
        "network_mode": "none",
        "cap_drop": ["ALL"],
        "security_opt": ["no-new-privileges:true"],
        "read_only": True,
        "tmpfs": {"/tmp": tmpfs_opts, "/work": tmpfs_opts.replace("noexec,", "")},
        "working_dir": "/work",
        "mem_limit": mem,
        "memswap_limit": mem,
        "nano_cpus": int(limits.cpus * 1e9),
        "pids_limit": limits.pids,
        "ulimits": [
            docker.types.Ulimit(name="nofile", soft=limits.nofile, hard=limits.nofile),
            docker.types.Ulimit(name="nproc", soft=limits.pids, hard=limits.pids),
            docker.types.Ulimit(
                name="fsize", soft=limits.fsize_mb << 20, hard=limits.fsize_mb << 20
            ),
            docker.types.Ulimit(name="core", soft=0, hard=0),
        ],
        "init": True,
        "ipc_mode": "private",
        "shm_size": f"{limits.shm_mb}m",
        "sysctls": dict(IPC_SYSCTLS),
        "labels": {SANDBOX_LABEL: "1", **(labels or {})},
        "environment": {"HOME": "/tmp", "PYTHONDONTWRITEBYTECODE": "1"},
    }
