"""The one settings model of rollstream.

Layers, lowest to highest: field defaults < TOML file < environment < CLI.

- TOML: the file named by ``--config`` or ``ROLLSTREAM_CONFIG``, else ``./rollstream.toml``
  when present. Sections are the nested models below (``[kafka]``, ``[redis]`` ...).
- Environment: ``ROLLSTREAM__SECTION__KEY=value`` (for example
  ``ROLLSTREAM__KAFKA__BOOTSTRAP=broker:9092``).
- CLI: ``rollstream --set section.key=value`` (repeatable) and the flags of each command.

``rollstream config show`` prints the merged result and where it came from.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, model_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

ENV_PREFIX = "ROLLSTREAM__"
CONFIG_ENV = "ROLLSTREAM_CONFIG"
DEFAULT_CONFIG_FILE = Path("rollstream.toml")


def _xdg(var: str, fallback: str) -> Path:
    base = os.environ.get(var)
    return Path(base) if base else Path.home() / fallback


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)


class KafkaSettings(Section):
    bootstrap: str | None = None
    """Bootstrap servers of an existing cluster. Unset: rollstream runs a local broker."""
    version: str = "4.4.0"
    """Apache Kafka version fetched from Maven Central for the local broker (pinned)."""
    port: int = 9092
    """Client port of the local broker (bound to 127.0.0.1 only)."""
    controller_port: int = 9093
    """KRaft controller port of the local broker (bound to 127.0.0.1 only)."""
    heap: str = "768m"
    """JVM max heap of the local broker."""
    start_timeout_s: float = 90.0
    """How long `rollstream up` waits for the local broker to answer."""

    @property
    def managed(self) -> bool:
        """True when rollstream runs the broker itself (no bootstrap configured)."""
        return self.bootstrap is None

    @property
    def endpoint(self) -> str:
        return self.bootstrap or f"127.0.0.1:{self.port}"


class RedisSettings(Section):
    url: str | None = None
    """URL of an existing Redis. Unset: rollstream uses or starts one on 127.0.0.1."""
    port: int = 6379
    """Port of the local Redis (bound to 127.0.0.1 only)."""

    @property
    def managed(self) -> bool:
        return self.url is None

    @property
    def endpoint(self) -> str:
        return self.url or f"redis://127.0.0.1:{self.port}/0"


class DockerSettings(Section):
    host: str | None = None
    """Docker engine address (like DOCKER_HOST). Unset: use the local engine, start it if
    needed."""
    socket: str = "/var/run/docker.sock"
    """Socket of the local engine that rollstream uses or starts."""
    install: bool = True
    """Install Debian's docker.io with apt-get when no dockerd binary exists (needs root)."""
    start_timeout_s: float = 60.0
    """How long `rollstream up` waits for a dockerd it started."""

    @property
    def managed(self) -> bool:
        return self.host is None

    @property
    def endpoint(self) -> str:
        return self.host or f"unix://{self.socket}"


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
    worker_id. Unique per live worker. Unset: the host name."""
    worker_metrics_port: int = Field(default=0, ge=0, le=65535)
    """Prometheus metrics of the sandbox worker on 127.0.0.1:PORT (0: off)."""
    shutdown_grace_s: float = Field(default=30.0, ge=0)
    """On SIGTERM, how long the worker lets in-flight jobs finish; the rest are left
    uncommitted, so another worker runs them."""
    dedup_ttl_s: float = Field(default=24 * 3600.0, gt=0)
    """How long a worker remembers (in Redis) a request_id+attempt it has answered."""


class TopicsSettings(Section):
    prefix: str = "rollstream"
    """Topic prefix of this run: every topic is `{prefix}.{name}`."""
    partitions: int = Field(default=4, ge=1, le=256)
    """Partitions of the group-keyed topics (trajectories, sandbox.results, rewards)."""


class BlobsSettings(Section):
    """Claim check: where payloads over the inline limit go (DESIGN.md section 2)."""

    inline_limit_bytes: int = Field(default=256 * 1024, ge=1024)
    """Encoded messages larger than this travel as a blob reference."""
    backend: Literal["redis", "dir"] = "redis"
    """Blob store: `redis` (the run's Redis, with TTL) or `dir` (files under `dir`)."""
    dir: Path | None = None
    """Directory of the `dir` backend (a shared mount when services run on several hosts).
    Unset: `blobs` under the stack's state_dir."""
    ttl_s: float = Field(default=7 * 24 * 3600.0, gt=0)
    """How long a blob is kept. Keep it at least as long as the retention of the topics
    whose records refer to blobs (7 days for trajectories and rewards), or replays of old
    offsets find their blobs gone (they are dead-lettered, not lost silently)."""
    redis_prefix: str = "rollstream:blob:"
    """Key prefix of blobs in Redis."""


class DispatcherSettings(Section):
    """The reward dispatcher (faust app, streams/)."""

    request_deadline_s: float = Field(default=120.0, gt=0)
    """A sandbox result missing this long after its request is retried (then masked)."""
    max_attempts: int = Field(default=3, ge=1, le=10)
    """Attempts per sandbox request (sandbox_error or missing result) before masking."""
    group_deadline_s: float = Field(default=600.0, gt=0)
    """A group still incomplete this long after its first member is emitted partially."""
    tombstone_ttl_s: float = Field(default=3600.0, ge=0)
    """How long an emitted group's member ids are kept to reject redeliveries."""
    tick_interval_s: float = Field(default=1.0, gt=0)
    """How often deadlines are checked."""
    sandbox_timeout_s: float = Field(default=10.0, gt=0)
    """Wall-clock limit of each sandbox job the dispatcher requests."""
    sandbox_memory_mb: int = Field(default=256, ge=16)
    """Memory limit of each sandbox job the dispatcher requests."""
    metrics_port: int = Field(default=0, ge=0, le=65535)
    """Prometheus metrics on 127.0.0.1:PORT (0: off)."""
    log_level: str = "warning"
    """Log level of the faust worker."""


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


class LearnerSettings(Section):
    """The asynchronous off-policy learner (learner/, DESIGN.md section 6)."""

    policy: str = Field(default="default", min_length=1)
    """Policy name: the key of its announcements on `weights` and of its blobs."""
    model: str = "tiny"
    """`tiny` (the built-in byte-level transformer) or a local Hugging Face causal-LM dir."""
    tiny_dim: int = Field(default=128, ge=8)
    """Width of the tiny transformer."""
    tiny_layers: int = Field(default=2, ge=1)
    """Blocks of the tiny transformer."""
    tiny_heads: int = Field(default=4, ge=1)
    """Attention heads of the tiny transformer (must divide tiny_dim)."""
    max_seq_len: int = Field(default=512, ge=8)
    """Longest prompt + completion of the tiny transformer; longer samples are dropped."""
    hf_dtype: Literal["float32", "bfloat16", "float16"] | None = None
    """Parameter dtype of a Hugging Face model. Unset: as saved."""
    seed: int = 0
    """Seed of the initial weights and every RNG of the learner."""
    device: str = "auto"
    """Torch device: `auto` (CUDA when available, else CPU), `cpu`, `cuda`, `cuda:1` ..."""
    amp: bool = True
    """bf16 autocast on devices that support it (the loss stays float32)."""
    lr: float = Field(default=3e-4, gt=0)
    """AdamW learning rate."""
    weight_decay: float = Field(default=0.0, ge=0)
    """AdamW weight decay."""
    grad_clip: float = Field(default=1.0, gt=0)
    """Gradient norm clip."""
    batch_tokens: int = Field(default=16384, ge=1)
    """Sequence tokens (prompt + completion) per learner update."""
    micro_batch_tokens: int = Field(default=8192, ge=1)
    """Padded tokens per forward/backward pass; gradients accumulate over a batch."""
    batch_max_wait_s: float = Field(default=5.0, gt=0)
    """A batch not full this long after its first sample is trained on as it is."""
    minibatches: int = Field(default=1, ge=1)
    """Optimizer steps per batch; above 1 the PPO clip against the proximal policy bites."""
    temperature: float = Field(default=1.0, gt=0)
    """Sampling temperature of the generators; the learner divides logits by it too."""
    max_lag: int = Field(default=4, ge=0)
    """Samples more than this many policy versions old are dropped (ledger: stale)."""
    clip_eps: float = Field(default=0.2, gt=0, lt=1)
    """PPO clip range of the ratio to the proximal policy."""
    clip_eps_high: float | None = Field(default=None, gt=0)
    """Upper clip range (clip-higher). Unset: clip_eps."""
    is_cap: float = Field(default=2.0, ge=1)
    """Truncation cap of the importance weight pi_prox / mu."""
    seq_mask_low: float = Field(default=0.5, gt=0, le=1)
    """Sequences whose geometric-mean importance weight is below this are masked."""
    seq_mask_high: float = Field(default=2.0, ge=1)
    """Sequences whose geometric-mean importance weight is above this are masked."""
    token_mask_low: float = Field(default=1e-3, gt=0, le=1)
    """Sequences with a token importance weight below this are masked."""
    token_mask_high: float = Field(default=1e3, ge=1)
    """Sequences with a token importance weight above this are masked."""
    kl_coef: float = Field(default=0.0, ge=0)
    """Weight of KL(pi || initial policy); 0 keeps no reference model."""
    entropy_coef: float = Field(default=0.0, ge=0)
    """Weight of the entropy bonus."""
    rwl_coef: float = Field(default=1.0, ge=0)
    """Weight of the reward-weighted likelihood term (traces without behaviour logprobs)."""
    rwl_beta: float = Field(default=1.0, gt=0)
    """Temperature of that term's weights exp(advantage / beta)."""
    rwl_max_weight: float = Field(default=20.0, gt=0)
    """Upper bound of that term's weights."""
    publish_every: int = Field(default=1, ge=1)
    """Publish weights (store + announcement on `weights`) every this many steps."""
    weight_store: Literal["redis", "dir"] = "redis"
    """Where published weights go: `redis` (chunked; small models) or `dir` (large ones)."""
    weight_dir: Path | None = None
    """Root of the `dir` weight store (a shared mount for several hosts). Unset:
    `weights` under the stack's state_dir."""
    weight_keep: int = Field(default=3, ge=1)
    """Published versions kept per policy in the weight store."""
    redis_chunk_bytes: int = Field(default=8 << 20, ge=1 << 16, le=256 << 20)
    """Chunk size of the Redis weight store."""
    checkpoint_dir: Path | None = None
    """Root of the checkpoints (`{dir}/{prefix}/{policy}`). Unset: `learner` under the
    stack's state_dir."""
    checkpoint_every: int = Field(default=20, ge=1)
    """Checkpoint every this many steps; ledger entries and offset commits follow each."""
    checkpoint_keep: int = Field(default=3, ge=1)
    """Checkpoints kept."""
    dedup_window: int = Field(default=100_000, ge=1)
    """Trajectory ids remembered (in checkpoints) to skip redelivered rewards."""
    tensorboard: bool = True
    """Write TensorBoard scalars when the tensorboard package is installed."""
    tensorboard_dir: Path | None = None
    """Where. Unset: `tensorboard/{prefix}` under the stack's state_dir."""
    metrics_port: int = Field(default=0, ge=0, le=65535)
    """Prometheus metrics on 127.0.0.1:PORT (0: off)."""


class IngestSettings(Section):
    """The ingest gateway for production agent traces and feedback (services/ingest,
    `rollstream ingest`, DESIGN.md section 8)."""

    host: str = "127.0.0.1"
    """Address the gateway listens on. Keep it on loopback and put a TLS-terminating proxy
    in front of it for outside clients."""
    port: int = Field(default=8700, ge=1, le=65535)
    """TCP port of the gateway."""
    tokens: SecretStr | None = None
    """Bearer tokens the gateway accepts, comma-separated. Prefer the environment
    (ROLLSTREAM__INGEST__TOKENS) or `tokens_file` to a TOML file. With neither set the
    gateway refuses to start."""
    tokens_file: Path | None = None
    """A file of bearer tokens, one per line (blank lines and `#` comments ignored); its
    tokens are accepted as well as those of `tokens`."""
    max_body_bytes: int = Field(default=4 << 20, ge=1024, le=64 << 20)
    """Largest request body; bigger ones get 413 before they are parsed."""
    max_messages: int = Field(default=512, ge=1, le=100_000)
    """Most chat messages in one trace."""
    max_tokens: int | None = Field(default=None, ge=2)
    """Traces longer than this many tokens (prompt + completion) get 422. Unset: no
    limit here; the learner drops samples longer than its context (ledger: too long)."""
    task_id: str = Field(default="production", min_length=1, max_length=256)
    """Task id of traces that name none (identifies the deployment in metrics and audit)."""
    idempotency_ttl_s: float = Field(default=7 * 24 * 3600.0, gt=0)
    """How long a client-supplied request id is remembered (a retry within this window is
    answered from the first request and publishes nothing)."""
    feedback_window_s: float = Field(default=7 * 24 * 3600.0, gt=0)
    """How long a trace without feedback waits for it (in Redis); after that feedback on it
    gets 404 and the trace is counted as expired unrated."""
    score_min: float = 0.0
    """Lowest feedback `score` accepted; it maps to reward 0."""
    score_max: float = 1.0
    """Highest feedback `score` accepted; it maps to reward 1."""
    label_rewards: str = "correct=1,helpful=1,resolved=1,incorrect=0,unhelpful=0,harmful=0"
    """Reward of each feedback `label`, as `label=reward` pairs, comma-separated (rewards
    in [0, 1]). Feedback with only an unknown label gets 422."""
    baseline: float = Field(default=0.5, ge=0, le=1)
    """Reward of a neutral judgement: advantage = (reward - baseline) / advantage_scale."""
    advantage_scale: float = Field(default=0.5, gt=0)
    """Divisor of the advantage (0.5 maps rewards 0..1 to advantages -1..1)."""
    log_level: str = "info"
    """Log level of the gateway (uvicorn's access log included)."""
    metrics_port: int = Field(default=0, ge=0, le=65535)
    """Prometheus metrics of the gateway on 127.0.0.1:PORT (0: off)."""

    @model_validator(mode="after")
    def _check(self) -> IngestSettings:
        if self.score_max <= self.score_min:
            raise ValueError("ingest.score_max must exceed ingest.score_min")
        self.label_map()  # raises on a malformed pair
        return self

    def label_map(self) -> dict[str, float]:
        """`label_rewards` as a dict (ValueError on a malformed pair)."""
        out: dict[str, float] = {}
        for pair in filter(None, (p.strip() for p in self.label_rewards.split(","))):
            label, sep, value = pair.partition("=")
            try:
                reward = float(value)
            except ValueError:
                reward = float("nan")
            if not sep or not label.strip() or not 0.0 <= reward <= 1.0:
                raise ValueError(f"ingest.label_rewards: {pair!r} is not label=reward in [0, 1]")
            out[label.strip()] = reward
        return out

    def token_list(self) -> list[str]:
        """Every accepted bearer token (from `tokens` and `tokens_file`)."""
        found = [] if self.tokens is None else self.tokens.get_secret_value().split(",")
        if self.tokens_file is not None:
            for line in self.tokens_file.read_text().splitlines():
                if not line.lstrip().startswith("#"):
                    found.append(line)
        return [t.strip() for t in found if t.strip()]


class ReplaySettings(Section):
    """`rollstream replay` and `rollstream export` (services/replay.py, services/export.py)."""

    rate: float = Field(default=0.0, ge=0)
    """Records per second replay publishes at most (token bucket; 0: no limit)."""
    burst: int = Field(default=100, ge=1)
    """Records replay may publish at once before `rate` applies."""
    batch: int = Field(default=500, ge=1, le=100_000)
    """Records in flight to Kafka at once (acknowledged before the next batch)."""
    max_records: int = Field(default=1_000_000, ge=1)
    """Largest selection one replay may publish (a guard against replaying a whole
    retention by mistake; raise it on purpose)."""
    read_timeout_s: float = Field(default=120.0, gt=0)
    """Longest time reading a topic range may take before replay or export gives up."""


def _parse_text_fields(data: Any, maps: tuple[str, ...], lists: tuple[str, ...]) -> Any:
    """Let `--set` and plain environment variables give maps and lists as text: a JSON
    value, or `a=1,b=2` for a map and `x,y` for a list."""
    from pydantic_core import from_json

    if not isinstance(data, dict):
        return data
    out = dict(data)
    for key in (*maps, *lists):
        value = out.get(key)
        if not isinstance(value, str):
            continue
        text = value.strip()
        if text[:1] in "{[":
            out[key] = from_json(text)
        elif key in maps:
            pairs = [p.partition("=") for p in text.split(",") if p.strip()]
            out[key] = {k.strip(): v.strip() for k, _, v in pairs}
        else:
            out[key] = [p.strip() for p in text.split(",") if p.strip()]
    return out


class GeneratorSettings(Section):
    """Rollout generators (`rollstream generator`, services/rollout/, DESIGN.md section 7).
    The sampling temperature is `learner.temperature`: the learner divides logits by the
    same number, so behaviour and learner logprobs describe one distribution."""

    top_p: float = Field(default=1.0, gt=0, le=1)
    """Nucleus sampling: keep the smallest set of tokens holding this much probability."""
    max_new_tokens: int = Field(default=64, ge=1)
    """Tokens sampled per assistant turn at most (finish_reason `length` when reached)."""
    max_turns: int = Field(default=4, ge=1, le=256)
    """Cap on a task's `max_turns` (multi-turn episodes through the sandbox tier)."""
    turn_timeout_s: float = Field(default=60.0, gt=0)
    """Multi-turn: how long a turn waits for its sandbox result before the episode ends
    there (finish_reason `turn_timeout`)."""
    observation_chars: int = Field(default=400, ge=0)
    """Multi-turn: most characters of a sandbox verdict appended as the observation."""
    pacing: bool = True
    """Admission control: stay at most (learner.max_lag + 1) x batch trajectories ahead of
    the learner's published samples_consumed."""
    batch_samples: int | None = Field(default=None, ge=1)
    """Trajectories per learner batch, for pacing. Unset: learner.batch_tokens divided by
    the mean length (prompt + completion tokens) of the trajectories sampled so far."""
    pace_stall_s: float = Field(default=15.0, ge=0)
    """Liveness of pacing: when the learner's samples_consumed has not moved for this long
    while a generator waits, one group may start anyway. The learner announces progress
    only when it trains, so in-flight samples it drops as stale would otherwise hold the
    generators forever. 0: never (strict bound)."""
    first_weights_timeout_s: float = Field(default=0.0, ge=0)
    """How long to wait for the first weights announcement before giving up (0: forever)."""
    torch_threads: int = Field(default=1, ge=1)
    """CPU threads torch may use for sampling."""
    seed: int | None = None
    """Seed of the sampling RNG. Unset: fresh entropy per process."""
    generator_id: str | None = None
    """Name of this generator in trajectories and logs. Unset: host:pid."""
    metrics_port: int = Field(default=0, ge=0, le=65535)
    """Prometheus metrics on 127.0.0.1:PORT (0: off)."""


class FeederSettings(Section):
    """The task feeder (`rollstream feeder`, services/rollout/feeder.py)."""

    suites: dict[str, float] = Field(default_factory=lambda: {"arith": 0.85, "pyfunc": 0.15})
    """Sampling weight per suite: built-in suites (services/suites/) and the suites named
    by tasks in `task_files`. A suite of the task files missing here gets weight 1."""
    task_files: list[Path] = Field(default_factory=list)
    """JSONL files of tasks (one Task object per line, see services/rollout/admission.py)."""
    group_size: int = Field(default=8, ge=1, le=4096)
    """Completions per task of the built-in suites (task files carry their own)."""
    max_turns: int = Field(default=1, ge=1, le=256)
    """Turn budget of the built-in code tasks (1: single completion; >1: multi-turn)."""
    rate: float = Field(default=0.0, ge=0)
    """Tasks per second at most (0: no limit; `max_backlog` still applies)."""
    max_backlog: int = Field(default=16, ge=1)
    """Tasks published but not yet taken by the generators' consumer group, at most."""
    max_sandbox_backlog: int = Field(default=16, ge=0)
    """While the sandbox tier has more requests than this waiting (published minus the
    sandbox workers' committed offsets), suites whose verifier runs in the sandbox are not
    sampled: their samples would only queue and reach the learner too stale to train on.
    0: no limit."""
    max_tasks: int = Field(default=0, ge=0)
    """Stop after publishing this many tasks (0: run until stopped)."""
    check_references: bool = True
    """Admission: a task's reference solution must pass its own verifier (in-process, or
    through the sandbox tier for sandboxed verifiers) before the task is fed."""
    reference_timeout_s: float = Field(default=120.0, gt=0)
    """How long a reference check waits for its sandbox result; then the task is rejected."""
    adapt: bool = False
    """Adapt suite weights from observed rewards: suites whose groups all pass or all fail
    (no learning signal) are sampled less."""
    adapt_floor: float = Field(default=0.2, gt=0, le=1)
    """With `adapt`: the smallest multiplier a suite's weight can get."""
    seed: int = 0
    """Seed of suite and task sampling."""

    @model_validator(mode="before")
    @classmethod
    def _text_forms(cls, data: Any) -> Any:
        return _parse_text_fields(data, maps=("suites",), lists=("task_files",))


DEMO_OVERRIDES: dict[str, str] = {
    # Batches of ~150-250 samples: about one policy version every 1-2 s on 2 cores, so a
    # sample verified in the sandbox (several seconds of transactional hops) arrives within
    # max_lag versions instead of being dropped as stale.
    "learner.batch_tokens": "2560",
    "learner.max_lag": "8",
    "learner.batch_max_wait_s": "3",
    "learner.max_seq_len": "256",
    "learner.checkpoint_every": "10",
    "generator.max_new_tokens": "48",
    # A tiny policy penalised for code that does not compile learns to emit short code
    # that compiles and fails (`def f(x): r`): a reward-hacking optimum with no way out.
    # The demo scores every failure mode of the model like an honest wrong answer.
    "rewards.compile_error": "0",
    "rewards.runtime_error": "0",
    "rewards.timeout": "0",
    "rewards.memory_limit": "0",
    "rewards.output_limit": "0",
}
"""The demo's defaults on top of the library defaults (see DemoSettings.overrides)."""


class DemoSettings(Section):
    """`rollstream demo`: the whole pipeline on the local stack (services/demo.py)."""

    budget_minutes: float = Field(default=8.0, gt=0)
    """How long the pipeline runs (warm-up, evaluation and the report come on top)."""
    prefix: str | None = None
    """Topic prefix of the run. Unset: a fresh `demo-YYYYmmdd-HHMMSS`."""
    report_dir: Path = Path("runs")
    """Where `{prefix}/` with the report, plot, metrics and service logs is written."""
    generators: int = Field(default=1, ge=1, le=16)
    """Generator processes."""
    sandbox_workers: int = Field(default=1, ge=1, le=16)
    """Sandbox worker processes (each with `sandbox.pool_size` containers)."""
    warmup_steps: int = Field(default=150, ge=0)
    """Supervised steps of the initial policy on the warm-up split of the suites (format
    and a little skill, like a small pretrained model); 0: a random initial policy."""
    warmup_lr: float = Field(default=1e-3, gt=0)
    """Learning rate of the warm-up."""
    warmup_batch: int = Field(default=64, ge=1)
    """Examples per warm-up step."""
    eval_tasks: int = Field(default=200, ge=1)
    """Held-out tasks per suite evaluated before and after (tasks never fed in training)."""
    eval_samples: int = Field(default=4, ge=1)
    """Sampled completions per held-out task for the sampled pass rate (plus one greedy)."""
    drain_s: float = Field(default=45.0, ge=0)
    """After the budget: how long in-flight trajectories get to be scored and trained."""
    overrides: dict[str, str] = Field(default_factory=lambda: dict(DEMO_OVERRIDES))
    """Settings the demo applies to its services (`section.key` -> value) unless set
    another way: a learner sized for a 2-core machine."""
    live: bool = True
    """Live progress table in the terminal (off: one log line every 15 s)."""

    @model_validator(mode="before")
    @classmethod
    def _text_forms(cls, data: Any) -> Any:
        return _parse_text_fields(data, maps=("overrides",), lists=())


class StackSettings(Section):
    state_dir: Path = Field(
        default_factory=lambda: _xdg("XDG_STATE_HOME", ".local/state") / "rollstream"
    )
    """Where the local stack keeps data, logs and pid files."""
    cache_dir: Path = Field(default_factory=lambda: _xdg("XDG_CACHE_HOME", ".cache") / "rollstream")
    """Where downloads (Kafka jars, image build trees) are cached."""


class Settings(BaseSettings):
    """All of rollstream's configuration; one nested section per service."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        env_nested_delimiter="__",
        extra="forbid",
        use_attribute_docstrings=True,
        validate_default=True,
    )

    kafka: KafkaSettings = Field(default_factory=KafkaSettings)
    """Kafka cluster (or the local broker)."""
    redis: RedisSettings = Field(default_factory=RedisSettings)
    """Redis (blob store, dedup keys)."""
    docker: DockerSettings = Field(default_factory=DockerSettings)
    """Docker engine that runs the sandboxes."""
    sandbox: SandboxSettings = Field(default_factory=SandboxSettings)
    """Sandbox image."""
    topics: TopicsSettings = Field(default_factory=TopicsSettings)
    """Topic names and sizes."""
    blobs: BlobsSettings = Field(default_factory=BlobsSettings)
    """Claim-check blob store."""
    dispatcher: DispatcherSettings = Field(default_factory=DispatcherSettings)
    """Reward dispatcher."""
    rewards: RewardsSettings = Field(default_factory=RewardsSettings)
    """Reward map from sandbox outcomes."""
    learner: LearnerSettings = Field(default_factory=LearnerSettings)
    """Asynchronous off-policy learner."""
    ingest: IngestSettings = Field(default_factory=IngestSettings)
    """Ingest gateway for production traces and feedback."""
    replay: ReplaySettings = Field(default_factory=ReplaySettings)
    """Replay and export of topics and log files."""
    generator: GeneratorSettings = Field(default_factory=GeneratorSettings)
    """Rollout generators."""
    feeder: FeederSettings = Field(default_factory=FeederSettings)
    """Task feeder."""
    demo: DemoSettings = Field(default_factory=DemoSettings)
    """`rollstream demo`."""
    stack: StackSettings = Field(default_factory=StackSettings)
    """Local stack state."""

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        toml_file = _config_file()
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        if toml_file is not None:
            sources.append(TomlConfigSettingsSource(settings_cls, toml_file=toml_file))
        return tuple(sources)


_CONFIG_OVERRIDE: Path | None = None
"""The file `load(config=...)` names, for the duration of that call."""


def _config_file() -> Path | None:
    named = str(_CONFIG_OVERRIDE) if _CONFIG_OVERRIDE else os.environ.get(CONFIG_ENV)
    if named:
        path = Path(named)
        if not path.is_file():
            raise FileNotFoundError(f"{CONFIG_ENV}={named}: no such config file")
        return path
    return DEFAULT_CONFIG_FILE if DEFAULT_CONFIG_FILE.is_file() else None


def parse_overrides(pairs: list[str]) -> dict[str, Any]:
    """Turn ``["kafka.port=19092", ...]`` into nested init kwargs (the CLI layer)."""
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--set {pair!r}: expected section.key=value")
        parts = key.strip().split(".")
        node = out
        for part in parts[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ValueError(f"--set {pair!r}: {part} is set twice")
            node = child
        node[parts[-1]] = value
    return out


def load(overrides: list[str] | None = None, config: Path | None = None) -> Settings:
    """Build the settings from every layer. ``config`` names a TOML file (like --config);
    without it, ROLLSTREAM_CONFIG or ./rollstream.toml."""
    global _CONFIG_OVERRIDE
    _CONFIG_OVERRIDE = config
    try:
        return Settings(**parse_overrides(overrides or []))
    finally:
        _CONFIG_OVERRIDE = None


def render_toml(settings: Settings) -> str:
    """The merged settings as a TOML document, one table per section, docstrings as comments."""
    lines: list[str] = []
    for section_name, section_field in Settings.model_fields.items():
        section = getattr(settings, section_name)
        lines.append(f"[{section_name}]  # {section_field.description or ''}".rstrip(" #"))
        for key, f in type(section).model_fields.items():
            value = getattr(section, key)
            if f.description:
                lines.append(f"# {f.description}".replace("\n", " "))
            lines.append(
                f"{key} = {_toml_value(value)}" if value is not None else f"# {key} = (unset)"
            )
        lines.append("")
    return "\n".join(lines)


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, dict):
        items = ", ".join(f"{_toml_value(str(k))} = {_toml_value(v)}" for k, v in value.items())
        return "{ " + items + " }" if items else "{}"
    if isinstance(value, list | tuple | set | frozenset):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, SecretStr):
        return '"**********"  # secret: not shown'
    return json.dumps(str(value))  # a JSON string is a valid TOML basic string
