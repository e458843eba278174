"""Shared helpers of the local stack: component reports, paths, package installs, probes."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
from dataclasses import asdict, dataclass, field
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
DEPLOY_DIR = REPO_ROOT / "deploy"


class StackError(RuntimeError):
    """A component could not be brought up; the message says what to do."""


@dataclass
class Check:
    """One line of `rollstream doctor` (and of `rollstream up`'s summary)."""

    component: str
    healthy: bool
    endpoint: str
    version: str = ""
    detail: str = ""
    """What was seen: 'running (started by rollstream)', or what failed."""
    fix: str = ""
    """For an unhealthy component: the command to run or the file to read."""
    managed: bool = False
    """True when rollstream started this component and `rollstream down` stops it."""
    extra: dict[str, object] = field(default_factory=dict)

    def to_json(self) -> dict[str, object]:
        return asdict(self)


def port_open(host: str, port: int, timeout_s: float = 0.5) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False


SBIN_DIRS = ("/usr/local/sbin", "/usr/sbin", "/sbin")


def which(binary: str) -> str | None:
    """shutil.which, also looking in the sbin directories (a non-login root shell, or CI,
    may not have them on PATH; dockerd, debootstrap and chroot live there)."""
    path = os.pathsep.join([os.environ.get("PATH", ""), *SBIN_DIRS])
    return shutil.which(binary, path=path)


def is_root() -> bool:
    return os.geteuid() == 0


_APT_UPDATED = False


def ensure_debian_packages(binaries: dict[str, str]) -> None:
    """Install the Debian package of each missing binary ({binary: package}) with apt-get."""
    global _APT_UPDATED
    missing = sorted({pkg for binary, pkg in binaries.items() if which(binary) is None})
    if not missing:
        return
    if not is_root() or which("apt-get") is None:
        raise StackError(
            f"missing {', '.join(missing)}; install with: sudo apt-get install -y "
            + " ".join(missing)
        )
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    if not _APT_UPDATED:
        subprocess.run(["apt-get", "update", "-qq"], check=False, env=env, capture_output=True)
        _APT_UPDATED = True
    proc = subprocess.run(
        ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *missing],
        env=env,
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        raise StackError(
            f"apt-get install {' '.join(missing)} failed:\n{proc.stderr.strip()[-2000:]}"
        )
