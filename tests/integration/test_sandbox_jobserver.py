"""The job server's isolation in the real warm pool, and the holes of issue 12 that need a
container (2: limits lowered then restored; 4: uids of containers created in parallel; 5:
a scratch wipe that fails). Each hole test failed on the pool before the job server."""

from __future__ import annotations

import asyncio
import os
import re
from collections.abc import AsyncIterator, Sequence

import pytest
import pytest_asyncio

from sandbox_workers import pool as pool_module
from sandbox_workers.hardening import SANDBOX_LABEL
from sandbox_workers.reaper import POOL_LABEL, UID_LABEL
from sandbox_workers.sandbox import VerifyingSandbox
from schemas.sandbox import Outcome
from services.infra import docker_engine
from services.sandbox_wiring import docker_sandbox
from services.settings import Settings
from tests.integration import sandbox_hostile_programs as hp
from tests.integration.test_sandbox_hostile import closed, with_pool
from tests.unit.sandbox_programs import io_request, pt_request

pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def pool(settings: Settings, _stack_up: None) -> AsyncIterator[VerifyingSandbox]:
    sandbox = await docker_sandbox(with_pool(settings, 2), "jobserver-suite")
    yield sandbox
    await closed(settings, sandbox)


async def test_the_candidate_has_no_privileges_and_reaches_no_one(pool: VerifyingSandbox) -> None:
    seen = []
    for _ in range(4):
        r = await pool.run(pt_request(hp.FACTS))
        assert r.outcome == Outcome.PASSED, r.detail
        first = r.stdout.splitlines()[0].split()
        uid, caps = int(first[1]), first[7:]
        assert first[3] == str(uid) and first[5] == "1", first  # euid, no_new_privs
        assert caps == ["0000000000000000"] * 5, first  # no capability, bounding set empty
        others = [ln.split() for ln in r.stdout.splitlines()[1:]]
        assert others and all(len(o) == 3 for o in others), others  # no signal, no limits
        assert all(int(o[2]) != uid for o in others), others  # nobody else has its uid
        seen.append(uid)
    assert len(set(seen)) == len(seen), seen  # a fresh uid for every job


async def test_limits_lowered_and_restored_are_not_a_masked_failure(pool: VerifyingSandbox) -> None:
    """Hole 2: the harness failed "by itself" while its limits were lowered, and they were
    back before the executor compared them: sandbox_error (masked) for a wrong answer."""
    r = await pool.run(pt_request(hp.LOWER_THEN_RESTORE, hp.ALLOCATING_TESTS, timeout_s=10.0))
    assert r.outcome == Outcome.FAILED, r.detail
    assert (r.passed, r.total) == (0, 1)


async def test_a_deep_tree_never_reaches_the_next_case(pool: VerifyingSandbox) -> None:
    """Hole 5: a tree too deep to wipe stayed behind, and the next case ran on it."""
    cases = [("alpha\n", "alpha"), ("beta\n", "beta"), ("gamma\n", "gamma")]
    r = await pool.run(io_request(hp.DEEP_TREE, cases, timeout_s=20.0))
    assert (r.outcome, r.passed, r.total) == (Outcome.PASSED, 3, 3), (r.detail, r.stdout)
    r = await pool.run(pt_request(hp.LOOK_FOR_SURVIVOR))  # and the next job starts clean
    assert r.outcome == Outcome.PASSED, r.detail


def _uids_of(settings: Settings, pool_ids: Sequence[str]) -> list[int]:
    client = docker_engine.client(settings)
    try:
        found = client.containers.list(all=True, filters={"label": SANDBOX_LABEL})
        return [int(c.labels[UID_LABEL]) for c in found if c.labels.get(POOL_LABEL) in pool_ids]
    finally:
        client.close()


class _FirstChoice:
    """The worst case of a random pick: every creator wants the same uids."""

    @staticmethod
    def sample(population: Sequence[int], k: int) -> list[int]:
        return list(population)[:k]

    @staticmethod
    def choice(seq: Sequence[int]) -> int:
        return seq[0]


async def test_containers_created_in_parallel_never_share_a_uid(
    settings: Settings, _stack_up: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Hole 4: pools created at the same time (two workers on one engine) could pick the
    same uid for their containers, which then shared one RLIMIT_NPROC budget."""
    monkeypatch.setattr(pool_module, "random", _FirstChoice)
    pools = await asyncio.gather(
        *(docker_sandbox(with_pool(settings, 3), f"uids-{i}") for i in range(2))
    )
    try:
        uids = _uids_of(settings, [getattr(p.runner, "pool_id", "") for p in pools])
        assert len(uids) == 6 and len(set(uids)) == 6, uids
    finally:
        for p in pools:
            await closed(settings, p)


async def test_the_exec_transport_gives_the_same_verdicts(settings: Settings) -> None:
    from sandbox_workers.pool import ContainerPool, PoolConfig
    from services.infra import image

    cfg = PoolConfig(image=image.image_ref(settings), size=1, transport="exec", exec_grace_s=3.0)
    runner = ContainerPool(cfg)
    await runner.start()
    sandbox = VerifyingSandbox(runner, worker_id="exec-transport")
    try:
        for code, want in ((hp.GOOD, Outcome.PASSED), (hp.WRONG, Outcome.FAILED),
                           (hp.KILL_EVERYTHING, Outcome.PASSED)):  # fmt: skip
            r = await sandbox.run(pt_request(code))
            assert r.outcome == want, r.detail
        r = await sandbox.run(io_request("print(input()[::-1])\n", [("abc\n", "cba")]))
        assert r.outcome == Outcome.PASSED, r.detail
        assert re.fullmatch(r"exec-transport/[0-9a-f]{12}", r.worker_id)
    finally:
        await closed(settings, sandbox)
    assert os.getpid() > 0
