"""The Docker engine: the configured or running one, else a dockerd that we start.

A dockerd started here runs with `--bridge=none --iptables=false`: no container of
rollstream ever needs a network, and nothing may reach private address ranges.
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING

from services.infra.common import Check, StackError, ensure_debian_packages, is_root, which
from services.infra.procs import ManagedProcess
from services.settings import Settings

if TYPE_CHECKING:
    import docker

SANDBOX_LABEL = "rollstream.sandbox"


def process(settings: Settings) -> ManagedProcess:
    return ManagedProcess("dockerd", settings.stack.state_dir)


def endpoint(settings: Settings) -> str:
    """The configured host, DOCKER_HOST, or the local socket (in that order)."""
    return settings.docker.host or os.environ.get("DOCKER_HOST") or settings.docker.endpoint


def managed(settings: Settings) -> bool:
    return settings.docker.managed and not os.environ.get("DOCKER_HOST")


def client(settings: Settings, timeout_s: float = 60.0) -> docker.DockerClient:
    import docker

    return docker.DockerClient(base_url=endpoint(settings), timeout=int(timeout_s))


def probe(settings: Settings, timeout_s: float = 5.0) -> Check:
    ep = endpoint(settings)
    check = Check(
        "docker", False, ep, managed=managed(settings) and process(settings).pid() is not None
    )
    try:
        c = client(settings, timeout_s)
        try:
            version = c.version()
        finally:
            c.close()
    except Exception as exc:
        check.detail = f"no engine at {ep}: {type(exc).__name__}: {str(exc)[:200]}"
        if managed(settings):
            check.fix = (
                f"run `rollstream up` (as root); if it fails, read {process(settings).log_file}"
            )
        else:
            check.fix = f"check the configured engine docker.host={ep}"
        return check
    check.healthy = True
    check.version = str(version.get("Version", ""))
    check.detail = f"api {version.get('ApiVersion', '?')}"
    return check


def up(settings: Settings) -> Check:
    current = probe(settings)
    if current.healthy or not managed(settings):
        current.detail = ("reused: " if current.healthy else "") + current.detail
        return current
    if not is_root():
        raise StackError(
            "no Docker engine answers and starting dockerd needs root: run `sudo rollstream up`, "
            "or set ROLLSTREAM__DOCKER__HOST to an engine you can reach"
        )
    if settings.docker.install:
        ensure_debian_packages({"dockerd": "docker.io"})
    binary = which("dockerd")
    if binary is None:
        raise StackError("dockerd is not installed: apt-get install -y docker.io")
    proc = process(settings)
    if proc.pid() is None:
        proc.start(
            [
                binary,
                "--host", f"unix://{settings.docker.socket}",
                "--bridge=none", "--iptables=false", "--ip6tables=false",
                "--pidfile", str(proc.dir / "dockerd.native.pid"),
            ]
        )  # fmt: skip
    deadline = time.monotonic() + settings.docker.start_timeout_s
    while time.monotonic() < deadline:
        if proc.pid() is None:
            raise StackError(f"dockerd exited at start; read {proc.log_file}:\n{proc.log_tail()}")
        check = probe(settings, timeout_s=2.0)
        if check.healthy:
            check.managed = True
            check.detail = "started: " + check.detail
            return check
        time.sleep(0.5)
    raise StackError(f"dockerd did not answer within {settings.docker.start_timeout_s:.0f}s")


def reap_sandboxes(settings: Settings) -> int:
    """Remove every container labelled rollstream.sandbox (left behind by a crash)."""
    try:
        c = client(settings, timeout_s=30)
    except Exception:
        return 0
    removed = 0
    try:
        for container in c.containers.list(all=True, filters={"label": SANDBOX_LABEL}):
            try:
                container.remove(force=True)
                removed += 1
            except Exception:
                pass
    except Exception:
        return removed
    finally:
        c.close()
    return removed
