"""Hostile programs in the real warm pool: each is contained and scored correctly, and the
pool keeps serving. At the end no container of ours is left (the pool is closed)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from sandbox_workers.sandbox import VerifyingSandbox
from schemas.sandbox import Outcome
from services.sandbox_wiring import docker_sandbox
from services.settings import Settings
from tests.integration import sandbox_hostile_programs as hp
from tests.integration.sandbox_leaks import of_pool, owned_by
from tests.unit.sandbox_programs import ADD_TESTS, GOOD, REWARD_HACKS, io_request, pt_request

pytestmark = pytest.mark.asyncio(loop_scope="module")


def with_pool(settings: Settings, size: int) -> Settings:
    # a short grace: how long the pool waits for a stopped executor before destroying all
    update = {"pool_size": size, "exec_grace_s": 3.0}
    return settings.model_copy(update={"sandbox": settings.sandbox.model_copy(update=update)})


async def closed(settings: Settings, sandbox: VerifyingSandbox) -> None:
    """Close a pool and check that none of its containers is left."""
    await sandbox.close()
    pool_id = getattr(sandbox.runner, "pool_id", "")
    assert pool_id and not of_pool(settings, pool_id), "pool containers left behind"


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def pool(settings: Settings, _stack_up: None) -> AsyncIterator[VerifyingSandbox]:
    sandbox = await docker_sandbox(with_pool(settings, 2), "hostile-suite")
    yield sandbox
    await closed(settings, sandbox)
    assert not owned_by(settings, [os.getpid()]), "this test process left containers behind"


async def still_serving(pool: VerifyingSandbox) -> None:
    r = await pool.run(pt_request(GOOD))
    assert r.outcome == Outcome.PASSED, r


@pytest.mark.parametrize(
    ("name", "code", "want"),
    [
        ("fork_bomb", hp.FORK_BOMB, Outcome.TIMEOUT),
        ("memory_bomb", hp.MEMORY_BOMB, Outcome.MEMORY_LIMIT),
        ("oom_bomb", hp.OOM_BOMB, Outcome.MEMORY_LIMIT),
        ("infinite_loop", hp.INFINITE_LOOP, Outcome.TIMEOUT),
        ("cpu_spin_in_a_thread", hp.THREAD_SPIN, Outcome.TIMEOUT),
        ("stdout_1gb", hp.STDOUT_1GB, Outcome.OUTPUT_LIMIT),
    ],
)
async def test_resource_attacks_are_contained(
    pool: VerifyingSandbox, name: str, code: str, want: Outcome
) -> None:
    limit = 20.0 if want == Outcome.MEMORY_LIMIT else 2.0  # OOM ends the job by itself
    r = await pool.run(pt_request(code, timeout_s=limit))
    assert r.outcome == want, (name, r.detail)
    assert r.passed == 0
    if want == Outcome.OUTPUT_LIMIT:
        assert r.truncated and len(r.stdout) <= pool.limits.keep_output
    await still_serving(pool)


async def test_an_oom_kill_in_the_last_stdin_stdout_case_is_seen(pool: VerifyingSandbox) -> None:
    """The executor reaps a job's last case itself, dropping its privileges; the container's
    OOM counter it reads afterwards must still tell the kill from an ordinary failure."""
    r = await pool.run(io_request(hp.OOM_BOMB, [("", "")], timeout_s=20.0))
    assert r.outcome == Outcome.MEMORY_LIMIT, r.detail
    await still_serving(pool)


async def test_stdout_flood_in_stdin_stdout_mode(pool: VerifyingSandbox) -> None:
    flood = "import sys\nwhile True:\n    sys.stdout.write('y' * 65536)\n"
    r = await pool.run(io_request(flood, [("", "y")], timeout_s=5.0))
    assert r.outcome == Outcome.OUTPUT_LIMIT, r.detail


async def test_filling_the_tmpfs_is_bounded_and_wiped(pool: VerifyingSandbox) -> None:
    r = await pool.run(pt_request(hp.FILL_TMPFS, timeout_s=20.0))
    assert r.outcome == Outcome.PASSED, r.detail
    wrote_mib = int(r.stdout.split()[1])
    assert 0 < wrote_mib <= 64 + 64 + 16  # /work + /tmp + /dev/shm, no more
    check = (
        "import os\nassert not os.listdir('/tmp') and len(os.listdir('/work')) == 1\n"
        "for i in range(4):\n    open(f'/tmp/x{i}', 'wb').write(b'\\0' * (15 << 20))\n" + GOOD
    )
    for _ in range(2):  # both containers: every job starts with empty, usable scratch
        r = await pool.run(pt_request(check))
        assert r.outcome == Outcome.PASSED, r.detail


async def test_no_network_and_no_secrets(pool: VerifyingSandbox) -> None:
    r = await pool.run(pt_request(hp.NETWORK, timeout_s=10.0))
    assert r.outcome == Outcome.PASSED, r.detail
    assert "CONNECTED" not in r.stdout and r.stdout.count("blocked") == 5, r.stdout
    r = await pool.run(pt_request(hp.SECRETS))
    assert r.outcome == Outcome.PASSED, r.detail
    assert "READ" not in r.stdout, r.stdout
    assert "denied /etc/shadow PermissionError" in r.stdout
    assert "denied /var/run/docker.sock FileNotFoundError" in r.stdout


async def test_background_process_does_not_outlive_its_job(settings: Settings) -> None:
    sandbox = await docker_sandbox(with_pool(settings, 1), "survivor-check")
    try:
        first = await sandbox.run(pt_request(hp.SURVIVOR))
        assert first.outcome == Outcome.PASSED, first.detail
        second = await sandbox.run(pt_request(hp.LOOK_FOR_SURVIVOR))
        assert second.outcome == Outcome.PASSED, second.detail
        assert first.worker_id == second.worker_id  # same container, reused after a clean job
        assert "survivors [] file False" in second.stdout, second.stdout
    finally:
        await closed(settings, sandbox)


@pytest.mark.parametrize(("name", "code", "tests"), REWARD_HACKS, ids=[h[0] for h in REWARD_HACKS])
async def test_reward_hacks_never_pass(
    pool: VerifyingSandbox, name: str, code: str, tests: str | None
) -> None:
    r = await pool.run(pt_request(code, tests or ADD_TESTS))
    assert r.outcome in (Outcome.FAILED, Outcome.RUNTIME_ERROR, Outcome.TAMPER), (name, r)
    assert r.passed < r.total or r.total == 0, (name, r)


@pytest.mark.parametrize(
    ("name", "code", "allowed"), hp.CONTAINER_HACKS, ids=[h[0] for h in hp.CONTAINER_HACKS]
)
async def test_attacks_on_the_verdict_channel(
    pool: VerifyingSandbox, name: str, code: str, allowed: tuple[str, ...]
) -> None:
    r = await pool.run(pt_request(code, timeout_s=2.0))
    assert r.outcome.value in allowed, (name, r)
    assert r.passed == 0 or r.passed < r.total
    await still_serving(pool)


@pytest.mark.parametrize(
    ("name", "code"), hp.HARMLESS_ATTACKS, ids=[h[0] for h in hp.HARMLESS_ATTACKS]
)
async def test_attacks_leave_an_honest_verdict_alone(
    pool: VerifyingSandbox, name: str, code: str
) -> None:
    r = await pool.run(pt_request(code, timeout_s=2.0))
    assert r.outcome == Outcome.PASSED, (name, r.detail)


async def test_concurrent_jobs_after_the_onslaught(pool: VerifyingSandbox) -> None:
    results = await asyncio.gather(*(pool.run(pt_request(GOOD)) for _ in range(6)))
    assert all(r.outcome == Outcome.PASSED for r in results)
    assert all(r.image_digest.startswith("sha256:") for r in results)
