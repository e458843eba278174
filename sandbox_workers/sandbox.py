"""Sandboxes: a request in, a verified result out (the `Sandbox` protocol).

`VerifyingSandbox` picks the verifier plugin, judges in-process answers itself, and sends
code to its `Runner` as an executor job with the request's limits (capped by the
configuration). A sandbox_error is retried up to `retries` times (the pool hands out a
fresh container after one), then reported; it is the infrastructure's fault and is masked
from training, never rewarded. Every result names the image, the verifier and version, and
the worker/container that produced it.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from typing import Any

from sandbox_workers.config import SandboxSettings
from sandbox_workers.protocol import Execution, Runner
from sandbox_workers.regex_guard import RegexGuard
from sandbox_workers.verifiers import InProcessVerifier, Registry, Verdict, default_registry
from schemas.sandbox import Outcome, SandboxRequest, SandboxResult

log = logging.getLogger("rollstream.sandbox")
_OUTCOMES = {o.value for o in Outcome}


@dataclass(frozen=True, slots=True)
class JobLimits:
    """Caps and per-job limits the sandbox applies to every request (from the `[sandbox]`
    section: `from_section`; its defaults live there only)."""

    max_timeout_s: float
    max_memory_mb: int
    output_limit: int
    keep_output: int
    nproc: int
    nofile: int
    fsize_mb: int
    max_job_bytes: int
    retries: int

    @classmethod
    def from_section(cls, s: SandboxSettings) -> JobLimits:
        return cls(
            max_timeout_s=s.max_timeout_s, max_memory_mb=s.memory_mb - 256,
            output_limit=s.output_limit_bytes, keep_output=s.keep_output_bytes,
            nproc=s.job_nproc, nofile=s.job_nofile, fsize_mb=s.job_fsize_mb,
            max_job_bytes=s.max_job_bytes, retries=s.retries,
        )  # fmt: skip


def interpret(ex: Execution) -> dict[str, Any]:
    """The executor's report, or the outcome its absence implies."""
    if ex.report is not None:
        report = dict(ex.report)
        if report.get("outcome") not in _OUTCOMES:
            return {"outcome": "sandbox_error", "detail": "the executor's report is unreadable"}
        return report
    if not ex.started:
        return {"outcome": "sandbox_error", "detail": f"the executor did not start: {ex.error}"}
    if ex.timed_out:
        return {"outcome": "timeout", "detail": "no report within the limit; container destroyed"}
    if ex.oom_before is not None and ex.oom_after is not None and ex.oom_after > ex.oom_before:
        return {"outcome": "memory_limit", "detail": "the executor was OOM-killed"}
    if ex.killed:
        return {"outcome": "tamper", "detail": "the executor was killed while the job ran"}
    return {"outcome": "sandbox_error", "detail": f"no report from the executor: {ex.error}"}


class VerifyingSandbox:
    def __init__(
        self,
        runner: Runner,
        limits: JobLimits | None = None,
        worker_id: str = "local",
        registry: Registry | None = None,
    ) -> None:
        self.runner = runner
        self.limits = limits or JobLimits.from_section(SandboxSettings())
        self.worker_id = worker_id
        self._guard = RegexGuard()
        self.registry = registry or default_registry(self._guard)

    async def run(self, request: SandboxRequest) -> SandboxResult:
        started = time.time()
        queue_s = max(0.0, started - request.created_at)
        plugin, problem = self.registry.lookup(request.verifier)
        if plugin is None:
            verdict = {"outcome": "sandbox_error", "detail": problem, "total": 0}
            return self._result(request, verdict, queue_s, "", "")
        if isinstance(plugin, InProcessVerifier):
            t0 = time.perf_counter()
            v: Verdict = await plugin.judge(request.code, request.verifier)
            out = {"outcome": v.outcome.value, "passed": v.passed, "total": v.total,
                   "detail": v.detail, "duration_s": time.perf_counter() - t0}  # fmt: skip
            return self._result(request, out, queue_s, plugin.name, plugin.version)
        job, note = self._job(plugin.job(request), request)
        report: dict[str, Any] = {}
        where = ""
        for attempt in range(self.limits.retries + 1):
            if len(json.dumps(job)) > self.limits.max_job_bytes:
                report = {"outcome": "sandbox_error", "detail": "job too large for the sandbox"}
                break
            ex = await self.runner.execute(job, job["timeout_s"])
            report, where = interpret(ex), ex.where
            queue_s += ex.waited_s
            if report["outcome"] != "sandbox_error":
                break
            log.warning("sandbox_error on %s (attempt %d): %s", where, attempt + 1,
                        report.get("detail"))  # fmt: skip
        if note:
            report["detail"] = f"{note}; {report.get('detail', '')}".rstrip("; ")
        return self._result(request, report, queue_s, plugin.name, plugin.version, where)

    def _job(self, base: dict[str, Any], request: SandboxRequest) -> tuple[dict[str, Any], str]:
        lim = self.limits
        timeout = min(max(request.timeout_s, 0.1), lim.max_timeout_s)
        memory = min(max(request.memory_mb, 32), lim.max_memory_mb)
        notes = []
        if timeout != request.timeout_s:
            notes.append(f"timeout set to {timeout:g}s")
        if memory != request.memory_mb:
            notes.append(f"memory set to {memory} MiB")
        job = {**base, "timeout_s": timeout, "memory_mb": memory, "output_limit": lim.output_limit,
               "keep_output": lim.keep_output, "nproc": lim.nproc, "nofile": lim.nofile,
               "fsize_mb": lim.fsize_mb}  # fmt: skip
        return job, ", ".join(notes)

    def _result(
        self,
        request: SandboxRequest,
        r: dict[str, Any],
        queue_s: float,
        name: str,
        version: str,
        where: str = "",
    ) -> SandboxResult:
        return SandboxResult(
            request_id=request.request_id, attempt=request.attempt,
            trajectory_id=request.trajectory_id, group_id=request.group_id,
            task_id=request.task_id, turn=request.turn, outcome=Outcome(r["outcome"]),
            passed=int(r.get("passed", 0)), total=int(r.get("total", 0)),
            duration_s=float(r.get("duration_s", 0.0)), cpu_s=float(r.get("cpu_s", 0.0)),
            queue_s=queue_s, stdout=str(r.get("stdout", "")), stderr=str(r.get("stderr", "")),
            truncated=bool(r.get("truncated", False)), detail=str(r.get("detail", ""))[:2000],
            image_digest=self.runner.image_digest if where else "",
            verifier_name=name, verifier_version=version,
            worker_id=f"{self.worker_id}/{where}" if where else self.worker_id,
            origin=request.origin, parent_id=request.id,
        )  # fmt: skip

    async def close(self) -> None:
        await self._guard.close()
        await self.runner.close()
