import json
import os
import time
from pathlib import Path

from services.infra.procs import ManagedProcess


def test_start_track_stop(tmp_path: Path) -> None:
    proc = ManagedProcess("sleeper", tmp_path)
    pid = proc.start(["sleep", "60"])
    try:
        assert proc.pid() == pid
        assert json.loads(proc.pid_file.read_text())["argv"] == ["sleep", "60"]
    finally:
        assert proc.stop(timeout_s=5)
    assert proc.pid() is None and not proc.pid_file.exists()
    assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text()
    assert proc.stop() is False  # nothing left to stop


def test_term_ignoring_process_is_killed(tmp_path: Path) -> None:
    proc = ManagedProcess("stubborn", tmp_path)
    proc.start(["sh", "-c", "trap '' TERM; while :; do sleep 0.1; done"])
    time.sleep(0.2)
    assert proc.stop(timeout_s=0.5)
    assert proc.pid() is None


def test_recycled_pid_is_not_ours(tmp_path: Path) -> None:
    proc = ManagedProcess("ghost", tmp_path)
    proc.dir.mkdir(parents=True)
    # Our own pid with a wrong start time: a stranger that happens to have the pid.
    proc.pid_file.write_text(json.dumps({"pid": os.getpid(), "start_ticks": 1}))
    assert proc.pid() is None and proc.exited_early()
    assert proc.stop() is False
    assert not proc.pid_file.exists()


def test_exited_early_and_log(tmp_path: Path) -> None:
    proc = ManagedProcess("short", tmp_path)
    proc.start(["sh", "-c", "echo hello-from-child; exit 3"])
    for _ in range(100):
        if proc.exited_early():
            break
        time.sleep(0.05)
        os.waitpid(-1, os.WNOHANG)
    assert proc.exited_early()
    assert "hello-from-child" in proc.log_tail()
