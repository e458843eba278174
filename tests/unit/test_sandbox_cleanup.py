"""The executor's cleanup order (deploy/sandbox/files/executor.py): who reaps the job's last
candidate, and when a killer must still be forked. The kills themselves are the real job
server's, tested against hostile programs in tests/integration/test_sandbox_hostile.py."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from tests.unit.sandbox_files import load

executor = load("executor")
privs = load("privs")


class Reaps:
    """Stands in for privs.reap_uid: records (uid, dirs, here); kills a harness it is
    asked to reap."""

    def __init__(self, harness: dict[int, int]) -> None:
        self.calls: list[tuple[int, tuple[str, ...], bool]] = []
        self.harness = harness  # uid -> pid

    def __call__(self, uid: int, killer: int, dirs: Any = (), budget_s: float = 10.0,
                 here: bool = False) -> bool:  # fmt: skip
        self.calls.append((uid, tuple(dirs), here))
        if uid in self.harness:
            os.kill(self.harness[uid], signal.SIGKILL)
        return True


def child(seconds: float) -> int:
    pid = os.fork()
    if pid == 0:
        time.sleep(seconds)
        os._exit(0)
    return pid


@pytest.fixture
def ctx(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    dirs = tuple(str(tmp_path / d) for d in ("work", "tmp", "shm"))
    for d in dirs:
        os.mkdir(d)
    monkeypatch.setattr(executor, "WIPE_DIRS", dirs)
    return executor.Context(True, dirs[0], 5000)


def test_the_last_candidate_is_reaped_in_process_once_the_harness_has_ended(
    ctx: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    reaps = Reaps({})
    monkeypatch.setattr(privs, "reap_uid", reaps)
    ctx.harness_pid = child(0.0)
    ctx.candidates = {11: 5002, 12: 5003}
    assert ctx.cleanup() is True
    assert [(uid, here) for uid, _, here in reaps.calls] == [(5002, False), (5003, True)]
    assert all(dirs == executor.WIPE_DIRS for _, dirs, _ in reaps.calls)
    assert ctx.harness_pid is None and not ctx.candidates


def test_a_running_harness_keeps_the_forked_killers_and_the_old_order(
    ctx: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    harness = child(30.0)
    reaps = Reaps({5001: harness})
    monkeypatch.setattr(privs, "reap_uid", reaps)
    ctx.harness_pid = harness
    ctx.candidates = {11: 5002}
    t0 = time.monotonic()
    assert ctx.cleanup() is False  # the harness had to be killed: not a clean end
    assert time.monotonic() - t0 < 10
    assert [(uid, here) for uid, _, here in reaps.calls] == [(5002, False), (5001, False)]


def test_without_a_harness_the_last_reap_is_in_process(
    ctx: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    reaps = Reaps({})
    monkeypatch.setattr(privs, "reap_uid", reaps)
    ctx.candidates = {11: 5002}
    assert ctx.cleanup() is True
    assert [(uid, here) for uid, _, here in reaps.calls] == [(5002, True)]


def test_nothing_left_to_reap_forks_no_killer(ctx: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    reaps = Reaps({})
    monkeypatch.setattr(privs, "reap_uid", reaps)
    ctx.harness_pid = child(0.0)
    assert ctx.cleanup() is True
    assert reaps.calls == []


def test_only_the_capabilities_still_held_are_dropped(monkeypatch: pytest.MonkeyPatch) -> None:
    dropped: list[int] = []
    monkeypatch.setattr(privs, "capabilities", lambda: {"CapBnd": 0b1000_0101})
    monkeypatch.setattr(privs, "_prctl", lambda option, cap: dropped.append(cap))
    privs.drop_bounding_set()
    assert dropped == [0, 2, 7]
