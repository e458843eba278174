"""Sandbox tier messages: what to run and verify, and what came of it (DESIGN.md section 4).

Frozen contract shared by the reward dispatcher (writer of requests, reader of results),
the generators in multi-turn mode (both), and the sandbox workers (the other side).
"""

from __future__ import annotations

import enum

import msgspec

from schemas.envelope import Message


class Outcome(enum.StrEnum):
    """How a sandbox job ended. The model's failures earn penalties; SANDBOX_ERROR is the
    infrastructure's fault: retried, then masked from training, never a reward."""

    PASSED = "passed"
    FAILED = "failed"
    COMPILE_ERROR = "compile_error"
    RUNTIME_ERROR = "runtime_error"
    TIMEOUT = "timeout"
    MEMORY_LIMIT = "memory_limit"
    OUTPUT_LIMIT = "output_limit"
    TAMPER = "tamper"
    SANDBOX_ERROR = "sandbox_error"


class IOCase(msgspec.Struct, kw_only=True):
    """One stdin/stdout case of the `stdin_stdout` verifier."""

    stdin: str = ""
    """Bytes fed to the program (UTF-8). writer: task author; reader: executor."""
    stdout: str
    """Expected whole output, compared after the verifier's whitespace rule. writer: task
    author; reader: verifier."""


class VerifierSpec(msgspec.Struct, kw_only=True):
    """Which verifier judges a completion, and its inputs. Travels in Task, Trajectory and
    SandboxRequest so every stage knows how to score without a lookup."""

    name: str
    """python_tests | stdin_stdout | math_answer | exact | regex. writer: task feeder;
    reader: dispatcher (routing), sandbox worker (plugin choice)."""
    version: str | None = None
    """Verifier version to use; None = the worker's current one. writer: task feeder,
    replay (re-scoring on purpose); reader: sandbox worker."""
    tests: str | None = None
    """python_tests: a Python file of `test_*` functions importing from `solution`; the
    hidden scoring tests that decide the reward (never shown to the policy). writer: task
    author; reader: sandbox worker."""
    feedback_tests: str | None = None
    """python_tests: the public example tests (same file format as `tests`), shown in the
    prompt and run for multi-turn feedback; never scored. None = no public tests. writer:
    task author (suites, task files); reader: generator (multi-turn observation)."""
    cases: list[IOCase] = msgspec.field(default_factory=list)
    """stdin_stdout: the cases. writer: task author; reader: sandbox worker."""
    answer: str | None = None
    """math_answer / exact: the reference answer. writer: task author; reader: verifier."""
    pattern: str | None = None
    """regex: the pattern the whole answer must match. writer: task author; reader: verifier."""
    needs_sandbox: bool = True
    """False for verifiers scored in-process (math_answer, exact, regex). writer: task feeder;
    reader: dispatcher."""


class SandboxRequest(Message, kw_only=True):
    """One job for the sandbox tier. Topic `sandbox.requests`, key request_id."""

    request_id: str
    """Stable across retries of the same job. writer: dispatcher/generator; reader: worker
    (dedup with attempt), dispatcher (join)."""
    attempt: int = 0
    """Retry number of this request (a sandbox_error is retried with attempt+1).
    writer: dispatcher; reader: worker (dedup key is request_id + attempt)."""
    trajectory_id: str
    """The trajectory whose code this is. writer: dispatcher; reader: dispatcher (join)."""
    group_id: str
    """Key of the result (co-partitioned with trajectories). writer: dispatcher; reader: worker."""
    task_id: str = ""
    """For metrics and audit. writer: dispatcher; reader: worker (echoed)."""
    code: str
    """The candidate's code (python_tests: the module `solution`; stdin_stdout: the program).
    writer: dispatcher (extracted from the completion); reader: executor."""
    verifier: VerifierSpec
    """How to judge it. writer: dispatcher (from the trajectory); reader: worker."""
    timeout_s: float = 10.0
    """Wall-clock limit of the whole job. writer: dispatcher; reader: executor."""
    memory_mb: int = 256
    """Memory limit of the job's process tree. writer: dispatcher; reader: executor."""
    turn: int = 0
    """Turn index in multi-turn episodes. writer: generator; reader: generator (echoed)."""


class SandboxResult(Message, kw_only=True):
    """What a job produced. Topic `sandbox.results`, key group_id."""

    request_id: str
    """Echo of the request. writer: worker; reader: dispatcher, generator (join)."""
    attempt: int = 0
    """Echo of the request. writer: worker; reader: dispatcher (retry bookkeeping)."""
    trajectory_id: str
    """Echo of the request. writer: worker; reader: dispatcher."""
    group_id: str
    """Echo of the request; the Kafka key. writer: worker; reader: dispatcher."""
    task_id: str = ""
    """Echo of the request. writer: worker; reader: metrics."""
    turn: int = 0
    """Echo of the request. writer: worker; reader: generator (multi-turn)."""
    outcome: Outcome
    """How the job ended. writer: worker; reader: dispatcher (reward map)."""
    passed: int = 0
    """Tests or cases passed. writer: worker; reader: dispatcher (pass-fraction reward)."""
    total: int = 0
    """Tests or cases counted. writer: worker; reader: dispatcher."""
    duration_s: float = 0.0
    """Wall time of the job inside the sandbox. writer: worker; reader: metrics."""
    cpu_s: float = 0.0
    """CPU time of the job's process tree. writer: worker; reader: metrics."""
    queue_s: float = 0.0
    """Time from request creation to job start. writer: worker; reader: metrics."""
    stdout: str = ""
    """Candidate's stdout, truncated. writer: worker; reader: generator (observation), people."""
    stderr: str = ""
    """Candidate's stderr, truncated. writer: worker; reader: generator, people."""
    truncated: bool = False
    """True when stdout/stderr were cut. writer: worker; reader: people."""
    detail: str = ""
    """Short human-readable reason (first failing test, error line). writer: worker; reader:
    people, ledger."""
    image_digest: str = ""
    """Sandbox image id the job ran in. writer: worker; reader: audit, replay."""
    verifier_name: str = ""
    """Verifier plugin that judged. writer: worker; reader: audit, replay."""
    verifier_version: str = ""
    """Its version. writer: worker; reader: audit, replay."""
    worker_id: str = ""
    """Which worker ran it. writer: worker; reader: operators."""
