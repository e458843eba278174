"""Admission of the `code` and `humaneval` suites through the real sandbox tier: each
reference solution, extracted from its fence as the dispatcher does, passes its hidden
scoring tests and (code) its public feedback tests in the warm pool. The default test runs
a fixed sample; the `soak` test runs every task."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator

import msgspec
import pytest
import pytest_asyncio

from sandbox_workers.sandbox import VerifyingSandbox
from schemas.rollout import Task
from schemas.sandbox import Outcome, SandboxRequest
from services import suites
from services.sandbox_wiring import docker_sandbox
from services.settings import Settings
from streams.groups import extract_code
from tests.integration.sandbox_leaks import of_pool, owned_by

pytestmark = pytest.mark.asyncio(loop_scope="module")
POOL_SIZE = 2
CODE = [t for s in ("train", "heldout") for t in suites.get("code").tasks(s)]
HUMANEVAL = suites.get("humaneval").tasks("heldout")
SAMPLE = CODE[::7] + HUMANEVAL[::40]
"""A fixed sample: every 7th code task (136 of 949) and 5 HumanEval problems."""


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def pool(settings: Settings, _stack_up: None) -> AsyncIterator[VerifyingSandbox]:
    cfg = settings.sandbox.model_copy(update={"pool_size": POOL_SIZE, "exec_grace_s": 3.0})
    sandbox = await docker_sandbox(settings.model_copy(update={"sandbox": cfg}), "code-suite")
    yield sandbox
    await sandbox.close()
    pool_id = getattr(sandbox.runner, "pool_id", "")
    assert pool_id and not of_pool(settings, pool_id), "pool containers left behind"
    assert not owned_by(settings, [os.getpid()]), "this test process left containers behind"


def requests(task: Task) -> list[tuple[str, SandboxRequest]]:
    """(which, request) for the task's hidden tests and, when it has them, its public ones."""
    code = extract_code(task.reference or "")
    specs = [("hidden", task.verifier)]
    if task.verifier.feedback_tests:
        public = msgspec.structs.replace(task.verifier, tests=task.verifier.feedback_tests)
        specs.append(("public", public))
    out = []
    for which, spec in specs:
        request = SandboxRequest(
            request_id=f"{task.task_id}:{which}", trajectory_id=task.task_id,
            group_id=task.task_id, task_id=task.task_id, code=code, verifier=spec,
            timeout_s=20.0,
        )  # fmt: skip
        out.append((which, request))
    return out


async def failures(pool: VerifyingSandbox, tasks: list[Task]) -> list[str]:
    """What did not pass, as readable lines (empty: every reference passed)."""
    gate = asyncio.Semaphore(2 * POOL_SIZE)

    async def one(which: str, request: SandboxRequest) -> str | None:
        async with gate:
            r = await pool.run(request)
        if r.outcome == Outcome.PASSED and r.passed == r.total > 0:
            return None
        return f"{request.task_id} ({which}): {r.outcome.value} {r.passed}/{r.total} {r.detail}"

    jobs = [one(w, r) for t in tasks for w, r in requests(t)]
    return [f for f in await asyncio.gather(*jobs) if f is not None]


async def test_sampled_references_pass_in_the_sandbox(pool: VerifyingSandbox) -> None:
    assert len(SAMPLE) == 141
    assert await failures(pool, SAMPLE) == []


@pytest.mark.soak
async def test_every_reference_passes_in_the_sandbox(pool: VerifyingSandbox) -> None:
    assert len(CODE) >= 260 and len(HUMANEVAL) == 164
    assert await failures(pool, CODE + HUMANEVAL) == []


async def test_a_wrong_solution_fails_the_hidden_tests_in_the_sandbox(
    pool: VerifyingSandbox,
) -> None:
    task = next(t for t in CODE if t.metadata["entry_point"] == "reverse_string")
    (_, hidden), (_, public) = requests(task)
    wrong = "def reverse_string(s):\n    return s"
    r = await pool.run(msgspec.structs.replace(hidden, code=wrong))
    assert r.outcome == Outcome.FAILED and 0 < r.passed < r.total  # '' and 'a' still pass
    r = await pool.run(msgspec.structs.replace(public, code=wrong))
    assert r.outcome == Outcome.FAILED and r.passed == 0
