"""The executor's wipe (deploy/sandbox/files/scrub.py) and the stdin_stdout rule that a case
whose leftovers could not be removed ends the job (issue 12, hole 5)."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.unit.sandbox_files import load

scrub = load("scrub")
executor = load("executor")
jobproc = load("jobproc")


@pytest.fixture
def scratch(tmp_path: Path) -> Iterator[Path]:
    """A directory on a tmpfs where there is one (as in the containers): a disk file system
    makes thousands of nested directories slow to create and remove on a busy machine."""
    base = "/dev/shm" if os.access("/dev/shm", os.W_OK) else str(tmp_path)
    path = Path(tempfile.mkdtemp(prefix="rollstream-scrub-", dir=base))
    yield path
    scrub.wipe([str(path)])
    shutil.rmtree(path, ignore_errors=True)


def deep_tree(root: Path, depth: int) -> None:
    fd = os.open(root, os.O_RDONLY)
    for _ in range(depth):
        os.mkdir("d", dir_fd=fd)
        child = os.open("d", os.O_RDONLY, dir_fd=fd)
        os.close(fd)
        fd = child
    with open(f"/proc/self/fd/{fd}/f", "w") as f:
        f.write("x")
    os.chmod(".", 0, dir_fd=fd)  # unreadable at the bottom
    os.close(fd)


def test_wipe_removes_a_tree_deeper_than_recursion_and_path_limits(scratch: Path) -> None:
    tmp_path = scratch
    deep_tree(tmp_path, 3000)  # 6000 bytes of path: over PATH_MAX, over the recursion limit
    for i in range(200):
        (tmp_path / f"file{i}").write_text("x")
    (tmp_path / "wide").mkdir()
    for i in range(300):
        (tmp_path / "wide" / f"sub{i}").mkdir()
    (tmp_path / "locked").mkdir(mode=0o500)
    assert scrub.wipe([str(tmp_path)]) and not os.listdir(tmp_path)


def test_wipe_never_follows_a_symlink(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep").write_text("precious")
    inside = tmp_path / "scratch"
    inside.mkdir()
    (inside / "link").symlink_to(outside)
    (inside / "filelink").symlink_to(outside / "keep")
    assert scrub.wipe([str(inside)])
    assert (outside / "keep").read_text() == "precious" and not os.listdir(inside)


def test_wipe_gives_up_at_the_deadline(tmp_path: Path) -> None:
    deep_tree(tmp_path, 50)
    assert not scrub.wipe([str(tmp_path)], deadline=0.0)


def test_a_case_that_left_something_behind_ends_the_job(monkeypatch: pytest.MonkeyPatch) -> None:
    """A failed wipe after case 1 stops the job: cases 2 and 3 never run on its leftovers,
    and they count as failed (not a masked sandbox_error, not a pass)."""
    ran = fake_cases(monkeypatch, clean=False)
    job = {"cases": [{"stdin": s, "stdout": s} for s in "abc"], "keep_output": 100}
    result = executor.stdin_stdout(job, None, None, 0.0)
    assert ran == [("a", False)]  # reaped by a forked killer: the job still needed privileges
    assert (result["outcome"], result["passed"], result["total"]) == ("failed", 1, 3)
    assert "not run" in result["detail"]


def test_only_the_last_case_is_reaped_by_the_executor_itself(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ran = fake_cases(monkeypatch, clean=True)
    job = {"cases": [{"stdin": s, "stdout": s} for s in "abc"], "keep_output": 100}
    result = executor.stdin_stdout(job, None, None, 0.0)
    assert ran == [("a", False), ("b", False), ("c", True)]
    assert (result["outcome"], result["passed"], result["total"]) == ("passed", 3, 3)


def fake_cases(monkeypatch: pytest.MonkeyPatch, clean: bool) -> list[tuple[str, bool]]:
    """executor._run_case replaced: every case prints its expected output and ends `clean`;
    returns the (stdin, last) of the cases run."""
    ran: list[tuple[str, bool]] = []

    def run_case(job: Any, ctx: Any, sp: Any, case: Any, deadline: float, last: bool) -> Any:
        ran.append((case["stdin"], last))
        out = jobproc.Capture(100)
        out(case["stdout"].encode())
        return "eof", 0, "ok\n", out, jobproc.Capture(100), clean

    monkeypatch.setattr(executor, "_run_case", run_case)
    return ran
