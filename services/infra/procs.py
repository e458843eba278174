"""Background processes that the local stack starts, tracked by pid files.

A pid file records the pid and the process's start time (from /proc), so a recycled
pid is never mistaken for ours and `rollstream down` never signals a stranger.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path


def _start_ticks(pid: int) -> int | None:
    """Kernel start time of a process (clock ticks since boot), or None if it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # The command name (field 2) may hold spaces and parentheses: split after the last ')'.
    fields = raw[raw.rindex(")") + 2 :].split()
    if fields[0] == "Z":  # a zombie has exited already
        return None
    return int(fields[19])


@dataclass
class ManagedProcess:
    """One long-running process of the local stack, e.g. the Kafka broker."""

    name: str
    state_dir: Path

    @property
    def dir(self) -> Path:
        return self.state_dir / self.name

    @property
    def pid_file(self) -> Path:
        return self.dir / f"{self.name}.pid"

    @property
    def log_file(self) -> Path:
        return self.dir / f"{self.name}.log"

    def pid(self) -> int | None:
        """The pid if our process is alive, else None (a stale pid file stays until stop)."""
        try:
            record = json.loads(self.pid_file.read_text())
            pid, ticks = int(record["pid"]), int(record["start_ticks"])
        except (FileNotFoundError, ValueError, KeyError, TypeError):
            return None
        return pid if _start_ticks(pid) == ticks else None

    def start(self, argv: list[str], env: dict[str, str] | None = None) -> int:
        """Start argv in its own session, output appended to the log file; return the pid."""
        self.dir.mkdir(parents=True, exist_ok=True)
        with self.log_file.open("ab") as log:
            log.write(f"\n--- {time.strftime('%Y-%m-%dT%H:%M:%S')} starting: {argv}\n".encode())
            log.flush()
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env={**os.environ, **(env or {})},
                cwd=self.dir,
            )
        ticks = _start_ticks(proc.pid)
        record = {"pid": proc.pid, "start_ticks": ticks, "argv": argv, "started_at": time.time()}
        tmp = self.pid_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(record))
        tmp.replace(self.pid_file)
        # Deliberately not waited on: the process outlives this CLI call. Detach the Popen
        # object so Python does not warn about a child still running at exit.
        proc.returncode = 0
        return proc.pid

    def exited_early(self) -> bool:
        """True when the pid file names a process that is no longer running."""
        return self.pid_file.exists() and self.pid() is None

    def stop(self, timeout_s: float = 20.0) -> bool:
        """SIGTERM the process group, then SIGKILL after timeout_s. True if one was running."""
        pid = self.pid()
        if pid is None:
            self.pid_file.unlink(missing_ok=True)
            return False
        _signal_group(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and self.pid() is not None:
            _reap(pid)
            time.sleep(0.1)
        if self.pid() is not None:
            _signal_group(pid, signal.SIGKILL)
            for _ in range(50):
                _reap(pid)
                if self.pid() is None:
                    break
                time.sleep(0.1)
        self.pid_file.unlink(missing_ok=True)
        return True

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_file.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return ""


def _signal_group(pid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        return
    except PermissionError:
        os.kill(pid, sig)


def _reap(pid: int) -> None:
    """Collect the exit status when the process is our own child (tests start it in-process)."""
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)
