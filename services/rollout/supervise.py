"""The demo's child processes: start each rollstream service in a session of its own
(its log in a file), watch them, and stop them in order (SIGTERM to the whole process
group, SIGKILL after a grace period). On Linux every child also gets SIGTERM if the demo
itself dies, so a killed demo leaves no orphans."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:  # runs in the child between fork and exec
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


@dataclass
class Service:
    name: str
    argv: list[str]
    env: dict[str, str]
    log: Path
    proc: subprocess.Popen[bytes] | None = None
    stopping: bool = False

    def start(self, cwd: Path) -> None:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                self.argv,
                env=self.env,
                cwd=cwd,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=_die_with_parent if sys.platform == "linux" else None,
            )

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def crashed(self) -> bool:
        """Exited although nobody asked it to."""
        return self.proc is not None and not self.stopping and self.proc.poll() is not None

    def signal(self, sig: signal.Signals) -> None:
        if self.alive and self.proc is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, sig)

    def tail(self, lines: int = 15) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


@dataclass
class Supervisor:
    cwd: Path
    log_dir: Path
    services: list[Service] = field(default_factory=list)

    def start(self, name: str, argv: list[str], env: dict[str, str]) -> Service:
        service = Service(name, argv, env, self.log_dir / f"{name}.log")
        service.start(self.cwd)
        self.services.append(service)
        return service

    def crashed(self) -> list[Service]:
        return [s for s in self.services if s.crashed]

    def named(self, prefix: str) -> list[Service]:
        return [s for s in self.services if s.name.startswith(prefix)]

    def stop(self, services: list[Service], grace_s: float) -> None:
        """SIGTERM each, wait up to `grace_s` for all, then SIGKILL the rest."""
        for s in services:
            s.stopping = True
            s.signal(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while any(s.alive for s in services) and time.monotonic() < deadline:
            time.sleep(0.1)
        for s in services:
            if s.alive:
                s.signal(signal.SIGKILL)
            if s.proc is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    s.proc.wait(10)

    def stop_all(self, grace_s: float = 30.0) -> None:
        self.stop([s for s in reversed(self.services) if s.alive], grace_s)
