"""The hardened container profile every sandbox runs under (DESIGN.md section 4).

No network, every capability dropped but the three the job server needs, no-new-privileges,
read-only root with size-capped tmpfs mounts, pids/memory(=memory+swap)/CPU limits,
ulimits, init, and the `rollstream.sandbox` label the reaper looks for.

Inside, the job server (deploy/sandbox/files/jobserver.py) runs as root with CAP_SETUID,
CAP_SETGID and CAP_SETPCAP only: enough to start every job process under an unprivileged
uid with no capabilities at all (bounding set cleared), nothing more. Each container owns a
block of UID_BLOCK uids that no other live container on the engine has: its killer uid, its
harness uid, and the candidate uids it cycles through (a fresh one per job and per
stdin/stdout case). So a candidate can signal nothing but its own processes, and
RLIMIT_NPROC (counted per uid by the kernel, across containers) bounds one job only. The
IPC sysctls leave a job no System V or POSIX message-queue object that could outlive it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

SANDBOX_LABEL: Final = "rollstream.sandbox"
SANDBOX_USER: Final = "10001:10001"
"""The image's unprivileged user (the pool's probes run as it)."""
SERVER_USER: Final = "0:0"
SERVER_CAPS: Final = ("SETUID", "SETGID", "SETPCAP")
"""What the job server keeps: switch uids/gids, clear the bounding set of its children."""
UID_BASE: Final = 1_000_000
UID_BLOCK: Final = 1024
"""Uids per container (keep in step with deploy/sandbox/files/jobserver.py)."""
UID_BLOCKS: Final = range(UID_BASE, UID_BASE + 4096 * UID_BLOCK, UID_BLOCK)
"""Base uids of the blocks (no passwd entries needed; never shared by two live containers)."""
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
    image: str,
    limits: Limits,
    labels: dict[str, str] | None = None,
    user: str = SANDBOX_USER,
    caps: tuple[str, ...] = (),
) -> dict[str, Any]:
    """Keyword arguments for docker-py `containers.run/create` that apply the profile. The
    default is the plain user with no capability at all; the pool's job-server containers
    pass SERVER_USER and SERVER_CAPS."""
    import docker.types

    mem = f"{limits.memory_mb}m"
    tmpfs_opts = f"rw,nosuid,nodev,noexec,size={limits.tmpfs_mb}m,mode=1777"
    return {
        "image": image,
        "user": user,
        "network_mode": "none",
        "cap_drop": ["ALL"],
        **({"cap_add": list(caps)} if caps else {}),
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
