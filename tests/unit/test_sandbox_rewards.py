"""The reward map, the outcome a silent executor implies, and the worker's ordered outbox."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from sandbox_workers.outbox import Outbox
from sandbox_workers.protocol import Execution
from sandbox_workers.rewards import PENALIZED, reward
from sandbox_workers.sandbox import interpret
from schemas import answered
from schemas.sandbox import Outcome
from services.settings import RewardsSettings

CFG = RewardsSettings()


def test_documented_defaults() -> None:
    assert reward(Outcome.PASSED, 4, 4, CFG) == 1.0
    assert reward(Outcome.FAILED, 1, 4, CFG) == 0.25
    assert reward(Outcome.FAILED, 0, 4, CFG) == 0.0
    assert reward(Outcome.COMPILE_ERROR, 0, 4, CFG) == -0.5
    for o in (Outcome.RUNTIME_ERROR, Outcome.TIMEOUT, Outcome.MEMORY_LIMIT, Outcome.OUTPUT_LIMIT):
        assert reward(o, 2, 4, CFG) == -0.25
    assert reward(Outcome.TAMPER, 4, 4, CFG) == -1.0
    assert reward(Outcome.SANDBOX_ERROR, 4, 4, CFG) is None  # masked, never a reward


def test_all_pass_mode() -> None:
    cfg = RewardsSettings(mode="all_pass")
    assert reward(Outcome.FAILED, 3, 4, cfg) == 0.0
    assert reward(Outcome.PASSED, 4, 4, cfg) == 1.0


@given(st.sampled_from(list(Outcome)), st.integers(0, 50), st.integers(0, 50))
def test_no_failure_beats_an_honest_wrong_answer(outcome: Outcome, k: int, n: int) -> None:
    r = reward(outcome, min(k, n), n, CFG)
    if outcome == Outcome.SANDBOX_ERROR:
        assert r is None
        return
    assert r is not None and CFG.tamper <= r <= CFG.passed
    if outcome in PENALIZED:
        assert r <= CFG.failed


@pytest.mark.parametrize(
    "bad",
    [{"timeout": 0.5}, {"tamper": -0.1}, {"passed": -1.0}, {"mode": "best_of"}],
)
def test_dishonest_maps_are_refused(bad: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        RewardsSettings(**bad)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("ex", "outcome"),
    [
        (Execution({"outcome": "passed", "passed": 1, "total": 1}), "passed"),
        (Execution({"outcome": "jackpot"}), "sandbox_error"),
        (Execution(None, started=False, error="no such container"), "sandbox_error"),
        (Execution(None, started=True, timed_out=True), "timeout"),
        (Execution(None, started=True, killed=True, oom_before=0, oom_after=1), "memory_limit"),
        (Execution(None, started=True, killed=True, oom_before=0, oom_after=0), "tamper"),
        (Execution(None, started=True, killed=True), "tamper"),
        (Execution(None, started=True, killed=False, error="exit code 1"), "sandbox_error"),
    ],
)
def test_interpret(ex: Execution, outcome: str) -> None:
    assert interpret(ex)["outcome"] == outcome


def test_outbox_publishes_what_finished_and_commits_the_contiguous_prefix() -> None:
    box: Outbox[str] = Outbox()
    a0, a1, a2 = box.add("a", 10), box.add("a", 11), box.add("a", 13)
    b0 = box.add("b", 5)
    Outbox.finish(a1, ["r11"])
    Outbox.finish(b0, [])
    batch = box.ready()  # a1 goes out although a0 still runs; a's commit stays at a0
    assert batch.outputs == ["r11"]
    assert batch.offsets == {"a": (10, answered.encode(10, [11])), "b": (6, "")}
    assert box.commit(batch) == [a1, b0] and box.pending() == 3
    assert not box.ready()  # nothing new finished
    Outbox.finish(a2, ["r13"])
    batch = box.ready()
    assert batch.outputs == ["r13"] and answered.decode(10, batch.offsets["a"][1]) == {11, 13}
    box.commit(batch)
    Outbox.finish(a0, ["r10"])
    batch = box.ready()
    assert batch.offsets == {"a": (14, "")} and batch.outputs == ["r10"]
    box.commit(batch)
    assert box.pending() == 0 and not box.ready()


def test_outbox_skips_what_the_last_owner_answered_and_keeps_marking_it() -> None:
    box: Outbox[str] = Outbox()
    box.inherit("a", {21, 23})
    a20, a21 = box.add("a", 20), box.add("a", 21)
    assert a21.outputs == [] and a20.outputs is None  # answered already: nothing to run
    batch = box.ready()
    assert batch.outputs == [] and batch.offsets == {"a": (20, answered.encode(20, [21, 23]))}
    box.commit(batch)
    Outbox.finish(a20, ["r20"])
    batch = box.ready()  # 23 was never fetched here: the metadata still marks it
    assert batch.offsets == {"a": (22, answered.encode(22, [23]))}
    box.commit(batch)
    assert box.add("a", 23).outputs == [] and box.add("a", 24).outputs is None


def test_outbox_holds_back_what_the_metadata_cannot_reach() -> None:
    box: Outbox[str] = Outbox()
    first, far = box.add("a", 0), box.add("a", answered.MAX_SPAN)
    Outbox.finish(far, ["late"])
    assert not box.ready()  # published only once the commit moves closer
    Outbox.finish(first, ["early"])
    batch = box.ready()
    assert batch.outputs == ["early"] and batch.offsets == {"a": (answered.MAX_SPAN, "")}
    box.commit(batch)
    assert box.ready().outputs == ["late"]


def test_outbox_commit_of_a_dropped_partition_forgets_it() -> None:
    box: Outbox[str] = Outbox()
    Outbox.finish(box.add("a", 1), ["x"])
    batch = box.ready()
    box.drop(["a"])
    assert len(box.commit(batch)) == 1 and not box.known("a") and box.pending() == 0


def test_outbox_drop_and_order_checks() -> None:
    box: Outbox[str] = Outbox()
    box.add("a", 1)
    with pytest.raises(ValueError):
        box.add("a", 1)
    assert [e.offset for e in box.drop(["a", "zz"])] == [1] and box.pending() == 0


class FlakyRunner:
    """Fails with infrastructure errors `failures` times, then succeeds."""

    image_digest = "sha256:test"

    def __init__(self, failures: int) -> None:
        self.failures, self.calls = failures, 0

    async def execute(self, job: dict[str, object], limit_s: float) -> Execution:
        self.calls += 1
        if self.calls <= self.failures:
            return Execution(
                None, started=False, error="container vanished", where=f"c{self.calls}"
            )
        return Execution({"outcome": "passed", "passed": 1, "total": 1}, where=f"c{self.calls}")

    async def close(self) -> None:
        return None


async def test_sandbox_error_is_retried_then_reported() -> None:
    from sandbox_workers.config import SandboxSettings
    from sandbox_workers.sandbox import JobLimits, VerifyingSandbox
    from tests.unit.sandbox_programs import GOOD, pt_request

    limits = JobLimits.from_section(SandboxSettings(retries=2))
    runner = FlakyRunner(failures=2)
    sb = VerifyingSandbox(runner, limits, worker_id="w")
    r = await sb.run(pt_request(GOOD))
    assert (r.outcome, runner.calls, r.worker_id) == (Outcome.PASSED, 3, "w/c3")
    assert r.image_digest == "sha256:test"
    runner = FlakyRunner(failures=10)
    sb = VerifyingSandbox(runner, limits, worker_id="w")
    r = await sb.run(pt_request(GOOD))
    assert (r.outcome, runner.calls) == (Outcome.SANDBOX_ERROR, 3)
    assert reward(r.outcome, r.passed, r.total, CFG) is None
    await sb.close()


async def test_limits_are_capped_and_noted() -> None:
    from dataclasses import replace

    from sandbox_workers.config import SandboxSettings
    from sandbox_workers.sandbox import JobLimits, VerifyingSandbox
    from tests.unit.sandbox_programs import GOOD, pt_request

    seen: list[dict[str, object]] = []

    class Recorder(FlakyRunner):
        async def execute(self, job: dict[str, object], limit_s: float) -> Execution:
            seen.append(job)
            return Execution({"outcome": "passed", "passed": 1, "total": 1}, where="c")

    sb = VerifyingSandbox(
        Recorder(0),
        replace(JobLimits.from_section(SandboxSettings()), max_timeout_s=3, max_memory_mb=300),
    )
    r = await sb.run(pt_request(GOOD, timeout_s=100.0, memory_mb=4096))
    assert (seen[0]["timeout_s"], seen[0]["memory_mb"]) == (3, 300)
    assert "timeout set to 3s" in r.detail and "memory set to 300 MiB" in r.detail
    await sb.close()
