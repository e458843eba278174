"""Settings sections owned by the sandbox tier: `[sandbox]` (pool, limits, image) and
`[rewards]` (the reward map). The one place their defaults and docs live."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)


class SandboxSettings(Section):
    image: str = "rollstream-sandbox"
    """Repository name of the sandbox image; the tag is derived from its recipe."""
    build: Literal["auto", "dockerfile", "debootstrap"] = "auto"
    """How to build the image: docker build when the base can be pulled, else debootstrap."""
    debian_suite: str = "bookworm"
    """Debian release of the sandbox root filesystem."""
    debian_mirror: str | None = None
    """Debian mirror for debootstrap. Unset: the first one in this machine's apt sources."""
    pull_timeout_s: float = 30.0
    """How long `auto` waits for the Dockerfile base image pull before using debootstrap."""
    pool_size: int = Field(default=2, ge=1, le=64)
    """Warm containers per sandbox worker; also how many jobs the worker runs at once."""
    memory_mb: int = Field(default=1024, ge=256)
    """Memory (= memory+swap) of each sandbox container. A job's own limit (the request's
    memory_mb) is capped at this minus 256 MiB, kept for the executor and the harness."""
    cpus: float = Field(default=1.0, gt=0)
    """CPU quota of each sandbox container, in cores."""
    pids: int = Field(default=64, ge=16)
    """Processes and threads per sandbox container (a fork bomb stops here)."""
    tmpfs_mb: int = Field(default=64, ge=8)
    """Size of each writable tmpfs of a container (/work and /tmp)."""
    max_timeout_s: float = Field(default=60.0, gt=0)
    """Longest wall-clock limit a job may ask for; longer requests are capped."""
    job_nproc: int = Field(default=32, ge=4)
    """RLIMIT_NPROC of a job: its processes and threads, executor included."""
    job_nofile: int = Field(default=128, ge=16)
    """RLIMIT_NOFILE of the candidate's processes."""
    job_fsize_mb: int = Field(default=16, ge=1)
    """RLIMIT_FSIZE of the candidate's processes: the largest file they may write."""
    output_limit_bytes: int = Field(default=1 << 20, ge=1024)
    """A job whose stdout+stderr exceed this is killed (outcome output_limit)."""
    keep_output_bytes: int = Field(default=16 * 1024, ge=0)
    """How much of the candidate's stdout and of its stderr a result carries."""
    max_job_bytes: int = Field(default=8 << 20, ge=1024)
    """Largest code + tests + cases of one job; bigger requests get sandbox_error."""
    retries: int = Field(default=2, ge=0, le=10)
    """Extra attempts, each on a fresh container, after a sandbox_error."""
    exec_grace_s: float = Field(default=10.0, gt=0)
    """How long past a job's limit the pool waits for the executor's report before it
    destroys the container (outcome timeout)."""
    max_jobs_per_container: int = Field(default=1000, ge=1)
    """A container is replaced after this many jobs even when every job was clean."""
    worker_id: str | None = None
    """Stable id of this sandbox worker: its Kafka transactional id and the results'
    worker_id. Unique per live worker. Unset: `{host}-{pid}-{random}`, unique per process."""
    worker_metrics_port: int = Field(default=0, ge=0, le=65535)
    """Prometheus metrics of the sandbox worker on 127.0.0.1:PORT (0: off)."""
    shutdown_grace_s: float = Field(default=30.0, ge=0)
    """On SIGTERM, how long the worker lets in-flight jobs finish; the rest are left
    uncommitted, so another worker runs them."""
    dedup_ttl_s: float = Field(default=24 * 3600.0, gt=0)
    """How long a worker remembers (in Redis) a request_id+attempt it has answered."""
    publish_linger_s: float = Field(default=0.1, ge=0, le=5)
    """How long the worker gathers finished results before it publishes them in one
    transaction (each transaction costs the broker and the worker about the same whatever
    it holds; 0: publish at once, one transaction per job at a steady pace)."""
    publish_stall_s: float = Field(default=90.0, gt=0)
    """A publication (one transaction of results and offsets) still unfinished after this
    long means the worker's Kafka clients are wedged (for instance after a pause past the
    transaction and session timeouts): the process exits (status 3) so that its
    supervisor starts a fresh one; nothing uncommitted is lost, it is redelivered."""


class RewardsSettings(Section):
    """The reward map from a sandbox outcome (sandbox_workers/rewards.py). Defaults: pass
    fraction between `failed` and `passed`; every failure mode of the model scores at or
    below an honest wrong answer, tamper lowest; sandbox_error is masked, never a reward."""

    mode: Literal["fraction", "all_pass"] = "fraction"
    """`fraction`: failed + (passed - failed) * tests_passed / tests_total; `all_pass`:
    `passed` only when every test passes, else `failed`."""
    passed: float = 1.0
    """Reward when every test or case passes."""
    failed: float = 0.0
    """Reward when none passes (outcome failed)."""
    compile_error: float = -0.5
    """Reward when the candidate's code does not compile."""
    runtime_error: float = -0.25
    """Reward when the candidate's code crashes (import failure, process died, every case
    crashed)."""
    timeout: float = -0.25
    """Reward when the job ran out of wall-clock or CPU time."""
    memory_limit: float = -0.25
    """Reward when the job ran out of memory."""
    output_limit: float = -0.25
    """Reward when the job wrote more output than allowed."""
    tamper: float = -1.0
    """Reward when the job attacked the sandbox or its verdict channel."""

    @model_validator(mode="after")
    def _ordered(self) -> RewardsSettings:
        penalties = {k: getattr(self, k) for k in PENALTY_FIELDS}
        worse = [k for k, v in penalties.items() if v > self.failed]
        if worse:
            raise ValueError(f"rewards {worse} exceed `failed` ({self.failed}): a failure mode "
                             "would beat an honest wrong answer")  # fmt: skip
        if self.tamper > min(penalties.values()):
            raise ValueError("rewards.tamper must be the lowest reward")
        if self.passed < self.failed:
            raise ValueError("rewards.passed must be at least rewards.failed")
        return self


PENALTY_FIELDS = (
    "compile_error", "runtime_error", "timeout", "memory_limit", "output_limit", "tamper"
)  # fmt: skip
