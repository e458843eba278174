"""The real sandbox: a started warm pool of hardened containers behind a VerifyingSandbox,
built from the `[sandbox]` section and the host that runs it (services/sandbox_wiring.py
passes the stack's image and Docker engine)."""

from __future__ import annotations

from sandbox_workers.config import SandboxSettings
from sandbox_workers.ports import SandboxHost
from sandbox_workers.sandbox import JobLimits, VerifyingSandbox


def worker_id(section: SandboxSettings, given: str | None = None) -> str:
    """The worker's id: `given`, else `sandbox.worker_id`, else unique to this process
    (host name, pid and a random tail: two workers on one host never share an id)."""
    import os
    import socket

    unique = f"{socket.gethostname()}-{os.getpid()}-{os.urandom(3).hex()}"
    return given or section.worker_id or unique


async def docker_sandbox(
    section: SandboxSettings, host: SandboxHost, worker: str | None = None
) -> VerifyingSandbox:
    """A started pool of `pool_size` containers; closed again if it cannot start."""
    from sandbox_workers.hardening import Limits
    from sandbox_workers.pool import ContainerPool, PoolConfig

    s = section
    limits = Limits(memory_mb=s.memory_mb, cpus=s.cpus, pids=s.pids, tmpfs_mb=s.tmpfs_mb)
    pool = ContainerPool(
        PoolConfig(
            image=host.image_ref(), limits=limits, size=s.pool_size,
            docker_endpoint=host.docker_endpoint(), exec_grace_s=s.exec_grace_s,
            max_jobs_per_container=s.max_jobs_per_container,
        )
    )  # fmt: skip
    try:
        await pool.start()
    except BaseException:
        await pool.close()
        raise
    return VerifyingSandbox(pool, JobLimits.from_section(s), worker_id(s, worker))
