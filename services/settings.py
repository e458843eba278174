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

import os
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
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
    exactly_once: bool = True
    """Kafka transactions: table updates, emitted messages and offsets commit atomically."""
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
        return str(value)
    return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'
