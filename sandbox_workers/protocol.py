"""The sandbox tier's interfaces (DESIGN.md section 4).

- `Sandbox`: what services use: a request in, a result out. `sandbox.VerifyingSandbox`
  implements it over a `Runner` (the Docker pool, or an unisolated local runner for
  benchmarks and tests).
- `Runner`: executes one executor job (deploy/sandbox/files/executor.py) and reports what
  the executor said, or why it said nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from schemas.sandbox import SandboxRequest, SandboxResult


class Sandbox(Protocol):
    """Runs and verifies one request. Never raises for anything the request contains:
    every failure is an outcome (the infrastructure's: sandbox_error)."""

    async def run(self, request: SandboxRequest) -> SandboxResult: ...

    async def close(self) -> None: ...


@dataclass
class Execution:
    """What a runner observed of one executor run."""

    report: dict[str, Any] | None
    """The executor's result event, or None when it gave none."""
    started: bool = False
    """The executor read the job and said so (the candidate may have run)."""
    oom_before: int | None = None
    """OOM-kill count of the container when the job started (from the started event)."""
    error: str = ""
    """Why there is no report: the infrastructure's account, for the detail field."""
    timed_out: bool = False
    """The runner gave up waiting past the job's limit plus grace."""
    killed: bool = False
    """The executor process was killed by a signal (exit code 128+n)."""
    oom_after: int | None = None
    """OOM-kill count read after a run without a report (None: not known)."""
    where: str = ""
    """Which container (or process) ran it, for the result's worker_id."""
    waited_s: float = 0.0
    """How long the job waited for a free container (part of the result's queue_s)."""
    extra: dict[str, Any] = field(default_factory=dict)


class Runner(Protocol):
    """Executes executor jobs; one job per container (or process) at a time."""

    image_digest: str
    """Id of the environment the jobs run in (sandbox image id, or "local")."""

    async def execute(self, job: dict[str, Any], limit_s: float) -> Execution: ...

    async def close(self) -> None: ...
