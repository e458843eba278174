"""1,000 mixed jobs in a row on one warm pool: good, wrong, every hostile program and reward
hack of the sandbox tests, interleaved; every verdict must be right, every container left
clean or replaced, and none left behind at the end (issue 12)."""

from __future__ import annotations

import asyncio
import itertools
import os
from collections import Counter
from collections.abc import Callable

import pytest

from schemas.sandbox import Outcome, SandboxRequest, SandboxResult
from services.sandbox_wiring import docker_sandbox
from services.settings import Settings
from tests.integration import sandbox_hostile_programs as hp
from tests.integration.sandbox_leaks import owned_by
from tests.integration.test_sandbox_hostile import closed, with_pool
from tests.unit import test_sandbox_holes as holes
from tests.unit.sandbox_programs import ADD_TESTS, GOOD, REWARD_HACKS, WRONG, io_request, pt_request

N_JOBS = 1000
Check = Callable[[SandboxResult], bool]


def outcome(*allowed: Outcome, unearned: bool = True) -> Check:
    def check(r: SandboxResult) -> bool:
        return r.outcome in allowed and (not unearned or r.passed < r.total or r.total == 0)

    return check


def passed_with(*needles: str, absent: tuple[str, ...] = ()) -> Check:
    def check(r: SandboxResult) -> bool:
        return (
            r.outcome == Outcome.PASSED
            and all(n in r.stdout for n in needles)
            and not any(a in r.stdout for a in absent)
        )

    return check


def hostile() -> list[tuple[str, SandboxRequest, Check]]:
    bad = outcome(Outcome.FAILED, Outcome.RUNTIME_ERROR, Outcome.TAMPER)
    flood = "import sys\nwhile True:\n    sys.stdout.write('y' * 65536)\n"
    items = [
        ("fork_bomb", pt_request(hp.FORK_BOMB, timeout_s=1.0), outcome(Outcome.TIMEOUT)),
        ("memory_bomb", pt_request(hp.MEMORY_BOMB, timeout_s=20.0), outcome(Outcome.MEMORY_LIMIT)),
        ("oom_bomb", pt_request(hp.OOM_BOMB, timeout_s=20.0), outcome(Outcome.MEMORY_LIMIT)),
        ("infinite_loop", pt_request(hp.INFINITE_LOOP, timeout_s=1.0), outcome(Outcome.TIMEOUT)),
        ("thread_spin", pt_request(hp.THREAD_SPIN, timeout_s=1.0), outcome(Outcome.TIMEOUT)),
        ("stdout_1gb", pt_request(hp.STDOUT_1GB, timeout_s=2.0), outcome(Outcome.OUTPUT_LIMIT)),
        ("io_flood", io_request(flood, [("", "y")], timeout_s=2.0), outcome(Outcome.OUTPUT_LIMIT)),
        ("fill_tmpfs", pt_request(hp.FILL_TMPFS, timeout_s=20.0), passed_with("wrote")),
        ("network", pt_request(hp.NETWORK, timeout_s=10.0), passed_with(absent=("CONNECTED",))),
        ("secrets", pt_request(hp.SECRETS), passed_with("denied /etc/shadow", absent=("READ",))),
        ("survivor", pt_request(hp.SURVIVOR), passed_with()),
        (
            "look_for_survivor",
            pt_request(hp.LOOK_FOR_SURVIVOR),
            passed_with("survivors [] file False"),
        ),
        (
            "lower_then_restore",
            pt_request(hp.LOWER_THEN_RESTORE, hp.ALLOCATING_TESTS, timeout_s=10.0),
            outcome(Outcome.FAILED),
        ),
        (
            "deep_tree",
            io_request(hp.DEEP_TREE, [("a\n", "a"), ("b\n", "b")], timeout_s=20.0),
            outcome(Outcome.PASSED, unearned=False),
        ),
        ("facts", pt_request(hp.FACTS), passed_with("nnp 1")),
    ]
    items += [
        (n, pt_request(c, timeout_s=2.0), outcome(*(Outcome(a) for a in ok)))
        for n, c, ok in hp.CONTAINER_HACKS
    ]
    items += [
        (n, pt_request(c, timeout_s=2.0), outcome(Outcome.PASSED, unearned=False))
        for n, c in hp.HARMLESS_ATTACKS
    ]
    items += [(n, pt_request(c, t or ADD_TESTS), bad) for n, c, t in REWARD_HACKS]
    for exc in holes.CONTROL_FLOW:
        code = f"def add(a, b):\n    raise {exc}\n"
        items.append((f"raise_{exc}", pt_request(code, holes.SHORT_CIRCUITS), bad))
    dead = "import os\ndef add(a, b):\n    os._exit(0)\n"
    raises_any = "import pytest\nfrom solution import add\n\ndef test_x():\n" + (
        "    with pytest.raises(Exception):\n        add(1, None)\n"
    )
    items.append(("dead_vs_raises", pt_request(dead, raises_any), outcome(Outcome.RUNTIME_ERROR)))
    late = "from solution import SIZE\nDATA = list(range(SIZE))\n\ndef test_x():\n    pass\n"
    items.append(
        (
            "late_import_failure",
            pt_request("import nope_xyz\n", late),
            outcome(Outcome.RUNTIME_ERROR),
        )
    )
    return items


def ordinary() -> list[tuple[str, SandboxRequest, Check]]:
    prog = "a, b = map(int, input().split())\nprint(a + b)\n"
    cases = [("1 2\n", "3"), ("5 5\n", "10")]
    return [
        ("good", pt_request(GOOD), outcome(Outcome.PASSED, unearned=False)),
        ("wrong", pt_request(WRONG), outcome(Outcome.FAILED)),
        ("io_good", io_request(prog, cases), outcome(Outcome.PASSED, unearned=False)),
        ("io_wrong", io_request(prog.replace("+", "-"), cases), outcome(Outcome.FAILED)),
        ("good", pt_request(GOOD), outcome(Outcome.PASSED, unearned=False)),
    ]


def plan() -> list[tuple[str, SandboxRequest, Check]]:
    """Every hostile program several times, each followed by ordinary jobs."""
    bad, plain = hostile(), itertools.cycle(ordinary())
    jobs: list[tuple[str, SandboxRequest, Check]] = []
    for item in itertools.cycle(bad):
        if len(jobs) >= N_JOBS:
            break
        jobs.append(item)
        jobs += [next(plain) for _ in range(3)]
    return jobs[:N_JOBS]


@pytest.mark.timeout(900)
@pytest.mark.parametrize(
    "n_jobs", [pytest.param(250, id="250"), pytest.param(N_JOBS, id="1000", marks=pytest.mark.soak)]
)
async def test_a_thousand_mixed_jobs_on_one_pool(
    settings: Settings, _stack_up: None, n_jobs: int
) -> None:
    """1,000 in a row (every hostile program at least five times) under `make soak`; the
    first 250 (every hostile program at least once) in `make test`."""
    jobs = plan()[:n_jobs]
    sandbox = await docker_sandbox(with_pool(settings, 2), f"mixed-{n_jobs}")
    wrong: list[str] = []
    seen: Counter[str] = Counter()
    queue = iter(jobs)

    async def worker() -> None:
        for name, request, check in queue:
            r = await sandbox.run(request)
            seen[name] += 1
            if not check(r):
                wrong.append(f"{name}: {r.outcome.value} {r.passed}/{r.total} {r.detail[:200]}")

    try:
        await asyncio.gather(worker(), worker())
    finally:
        await closed(settings, sandbox)
    assert sum(seen.values()) == n_jobs
    each = 5 if n_jobs == N_JOBS else 1
    assert all(seen[name] >= each for name, _, _ in hostile()), seen
    assert not wrong, wrong[:20]
    assert not owned_by(settings, [os.getpid()]), "containers left behind"
