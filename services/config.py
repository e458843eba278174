"""Settings sections owned by services/: the local stack (kafka, redis, docker, stack),
topics, the claim-check blob store, replay and the demo. services/settings.py composes
these with the sections the lower packages own."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


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
    brokers: int = Field(default=1, ge=1, le=9)
    """Nodes of the local KRaft cluster, each a combined broker and controller. 1: the
    single broker on `port` and `controller_port`, state under `{state_dir}/kafka/`.
    N > 1: node i (1..N) listens on `port + (i-1) * node_port_step` and
    `controller_port + (i-1) * node_port_step`, keeps its state under
    `{state_dir}/kafka-{i}/`, and all N nodes form the controller quorum. Topics get
    replication 3 and min.insync.replicas 2 on a cluster of 3 or more brokers."""
    node_port_step: int = Field(default=10, ge=2, le=1000)
    """Port distance between consecutive nodes of a multi-node local cluster."""

    @model_validator(mode="after")
    def _distinct_ports(self) -> KafkaSettings:
        ports = [p for node in self.node_ports() for p in node]
        if len(set(ports)) != len(ports) or max(ports) > 65535:
            raise ValueError(
                f"kafka: the {self.brokers} node(s) need distinct ports up to 65535, got "
                f"{ports} (port={self.port}, controller_port={self.controller_port}, "
                f"node_port_step={self.node_port_step})"
            )
        return self

    def node_ports(self) -> list[tuple[int, int]]:
        """(client port, controller port) of each local node, node 1 first."""
        step = self.node_port_step
        return [
            (self.port + i * step, self.controller_port + i * step) for i in range(self.brokers)
        ]

    @property
    def managed(self) -> bool:
        """True when rollstream runs the broker itself (no bootstrap configured)."""
        return self.bootstrap is None

    @property
    def endpoint(self) -> str:
        """Bootstrap servers: the configured ones, else every local node."""
        return self.bootstrap or ",".join(f"127.0.0.1:{p}" for p, _ in self.node_ports())


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
"""The demo's defaults for the tiny policy on top of the library defaults (see
DemoSettings.overrides)."""

PRETRAINED_DEMO_OVERRIDES: dict[str, str] = {
    # SmolLM2-135M on the `code` suite, sized for 2 CPU cores: a group of 8 completions of
    # up to 160 new tokens takes tens of seconds, a learner step on 4 groups (32 samples of
    # ~180 tokens) about a minute in float32 (bf16 autocast, learner.cpu_amp, cuts that
    # 2.7x on a CPU where bf16 matmuls measure faster; elsewhere it is ignored, as on a
    # 2-core Xeon whose avx512_bf16 ran them at half float32's speed), so batches are small, a
    # batch is trained on when full or after 4 minutes, and max_lag allows the few
    # versions a sample can age by in flight.
    # Temperature 0.7: at 1.0 a third of the 135M model's training samples did not compile
    # (136 of 392 in demo-20261206-032905, train split), incoherent text whose gradient
    # mostly pushes down tokens greedy decoding never picks. The learner takes both cores
    # while the generators wait at the pacing window; bf16 blobs halve publishing (where
    # the generators sample in bf16 they round to it anyway; evaluation decodes in float32).
    # LoRA (rank 16; learner.lora_rank=0 with lr 1e-5 trains every weight): its
    # learner step is cheaper and its generators sample in int4 (learner.sample_dtype
    # auto on a CPU): 17 learner steps and 1.10-1.13 samples/s in two 8-minute runs on a
    # 2-core Intel Xeon, against 12 and 0.87 with full fine-tuning (runs demo-20261207-
    # 084754 and -095313 against demo-20261207-075937). lr 3e-4, chosen on the training
    # reward only: at 1e-4 it did not rise within a run (first third of the versions
    # 0.421, last third 0.419, demo-20261207-132657), at 3e-4 it did (0.490 -> 0.665,
    # compile errors 5% -> 1%, demo-20261207-141037).
    # Calibrated tasks: of the 632
    # training tasks, the ones SmolLM2 solved in under 5% of its samples are left out (the
    # 232 added in stop 27 passed 0.7% of 880 samples: groups with nothing to prefer), and
    # of each family (one function, other constants) two members are fed: 80 tasks, 55 of
    # them functions of their own, where 124 of the 150 fed before were family members
    # (13 functions); what a run learned from those did not carry over to held-out code.
    "feeder.suites": '{"code": 1.0}',
    "feeder.calibration": "smollm2-code",
    "feeder.family_max": "2",
    "feeder.group_size": "8",
    "feeder.adapt": "true",
    "feeder.max_backlog": "4",
    "learner.lr": "3e-4",
    "learner.lora_rank": "16",
    "learner.cpu_amp": "true",
    "learner.torch_threads": "2",
    "learner.batch_tokens": "6000",
    "learner.micro_batch_tokens": "2000",
    "learner.batch_max_wait_s": "240",
    "learner.max_lag": "3",
    "learner.checkpoint_every": "1000",
    "learner.weight_store": "dir",
    "learner.weight_keep": "2",
    "learner.temperature": "0.7",
    "learner.publish_dtype": "bfloat16",
    "generator.max_new_tokens": "160",
    "demo.warmup_steps": "0",
    "demo.eval_samples": "0",
    # every held-out code task: the binomial standard error falls with their number
    "demo.eval_tasks": "0",
    "demo.eval_extra": '{"humaneval": 40}',
    "demo.drain_s": "150",
    # 16 minutes of training (the tiny policy's demo keeps 8): in every 8-minute run the
    # training reward was still rising in the last third of the policy versions (the pass
    # rate over each task's calibrated rate: +0.06 to +0.13 there, from -0.06 to -0.09 in
    # the first third; demo-20261207-141037 to -165613), and a 16-minute run went on rising
    # (-0.02, +0.12, +0.20; 37 learner steps, demo-20261207-172021). The demo takes about
    # 26 minutes so (40 steps, evaluating all 317 held-out code tasks, demo-20261207-
    # 230531); on a 2-core AMD EPYC with AVX2 only (no AVX-512), 29 minutes and 24-28
    # learner steps while it evaluated 178 (demo-20261207-191447, -200031, -205337).
    "demo.budget_minutes": "16",
}
"""The demo's defaults for a pretrained policy (`demo.policy` other than tiny)."""


class DemoSettings(Section):
    """`rollstream demo`: the whole pipeline on the local stack (services/demo.py)."""

    policy: str = "smollm2"
    """The model the demo trains, unless learner.model is set: `smollm2` (SmolLM2-135M-
    Instruct on the `code` suite, PRETRAINED_DEMO_OVERRIDES) or `tiny` (the byte-level
    policy on arith and pyfunc, DEMO_OVERRIDES); any learner.model form works."""
    two_turn: bool = False
    """Two-turn self-correction: each code task gets a second turn after its first turn's
    code failed the public tests (feeder.max_turns = 2)."""
    eval_extra: dict[str, int] = Field(default_factory=dict)
    """Evaluation-only suites evaluated before and after as well: name -> tasks (the first
    N of its held-out split, a fixed subset)."""
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
    dispatchers: int = Field(default=1, ge=1, le=16)
    """Reward dispatcher processes (one consumer group: they share the partitions)."""
    warmup_steps: int = Field(default=150, ge=0)
    """Supervised steps of the initial policy on the warm-up split of the suites (format
    and a little skill, like a small pretrained model); 0: a random initial policy."""
    warmup_lr: float = Field(default=1e-3, gt=0)
    """Learning rate of the warm-up."""
    warmup_batch: int = Field(default=64, ge=1)
    """Examples per warm-up step."""
    eval_tasks: int = Field(default=200, ge=0)
    """Held-out tasks per suite evaluated before and after (the first N of its held-out
    split, tasks never fed in training); 0: every one."""
    eval_samples: int = Field(default=4, ge=0)
    """Sampled completions per held-out task for the sampled pass rate (plus one greedy);
    0: greedy only."""
    drain_s: float = Field(default=45.0, ge=0)
    """After the budget: how long in-flight trajectories get to be scored and trained."""
    overrides: dict[str, str] | None = None
    """Settings the demo applies to its services (`section.key` -> value) unless set
    another way: a learner sized for a 2-core machine. Unset: DEMO_OVERRIDES for the tiny
    policy, PRETRAINED_DEMO_OVERRIDES for a pretrained one (services/config.py)."""
    live: bool = True
    """Live progress table in the terminal (off: one log line every 15 s)."""

    @model_validator(mode="before")
    @classmethod
    def _text_forms(cls, data: Any) -> Any:
        return _parse_text_fields(data, maps=("overrides", "eval_extra"), lists=())

    def overrides_for(self, model: str) -> dict[str, str]:
        """The overrides of a run of `model` (`overrides` when set)."""
        if self.overrides is not None:
            return dict(self.overrides)
        return dict(DEMO_OVERRIDES if model == "tiny" else PRETRAINED_DEMO_OVERRIDES)


class StackSettings(Section):
    state_dir: Path = Field(
        default_factory=lambda: _xdg("XDG_STATE_HOME", ".local/state") / "rollstream"
    )
    """Where the local stack keeps data, logs and pid files."""
    cache_dir: Path = Field(default_factory=lambda: _xdg("XDG_CACHE_HOME", ".cache") / "rollstream")
    """Where downloads (Kafka jars, image build trees) are cached."""
