"""Settings section owned by the learner: `[learner]`. The one place its defaults and docs
live."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

D = TypeVar("D", bound="DataclassInstance")


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)


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
    sample_dtype: Literal["auto", "float32", "bfloat16", "int4"] = "auto"
    """Weight dtype a Hugging Face Llama-family model samples with (learner/decode.py):
    `auto` is bfloat16 where its matmuls are native (CUDA, a CPU with avx512_bf16/AMX where
    they measure faster than float32), else the model's dtype; on a CPU with LoRA on, int4
    where the frozen base weights are on a 4-bit grid (SmolLM2's, converted from its Q4_1
    GGUF). `int4` (CPU): the layers' weights in 4 bits, the LM head in 8, LoRA adapters
    applied in full (learner/quant.py); with full fine-tuning each version is requantized
    and changes below the grid's spacing are lost.
    Behaviour logprobs are those of the weights that sampled; the learner's importance
    correction absorbs their difference from its own dtype."""
    sample_compile: bool = False
    """Compile the sampler's per-token step (learner/decode.py) with torch.compile
    (inductor, dynamic shapes). On a 2-core Intel Xeon it drew 20-30% more tokens/s in int4
    (benchmarks/generation.py); the first compile takes minutes per process on 2 cores
    (then cached on disk, TORCHINDUCTOR_CACHE_DIR), and a batch of one row compiles once
    more. Later weight versions reuse the compiled code. Off by default: the demo's
    generators wait on its learner, and the compile would take the learner's cores."""
    lora_rank: int = Field(default=0, ge=0)
    """LoRA rank of a Hugging Face model (peft); 0: full fine-tuning. With LoRA only the
    adapters train, are published and are checkpointed as weights."""
    lora_alpha: float = Field(default=16.0, gt=0)
    """LoRA scaling numerator (the update is scaled by lora_alpha / lora_rank)."""
    lora_targets: tuple[str, ...] = Field(
        default=("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"),
        min_length=1,
    )
    """Names of the linear modules LoRA adapts."""
    seed: int = 0
    """Seed of the initial weights and every RNG of the learner."""
    device: str = "auto"
    """Torch device: `auto` (CUDA when available, else CPU), `cpu`, `cuda`, `cuda:1` ..."""
    nproc: int = Field(default=1, ge=1)
    """Processes of `rollstream learner` on this host (data-parallel ranks, one device each;
    learner/parallel.py). Under torchrun the environment's WORLD_SIZE rules instead."""
    parallel: Literal["ddp", "fsdp"] = "ddp"
    """How several ranks share the model: `ddp` (a full replica each, gradients all-reduced)
    or `fsdp` (FULL_SHARD: parameters, gradients and optimizer state sharded over the ranks,
    for a model that does not fit one device)."""
    amp: bool = True
    """bf16 autocast on CUDA devices that support it (the loss stays float32)."""
    cpu_amp: bool = False
    """bf16 autocast on a CPU that computes in bf16 natively (avx512_bf16 or AMX, read from
    the CPU's flags) and where a bf16 matmul measures faster than float32 at start
    (learner/cpu.py `fast_bf16_cpu`); ignored elsewhere, where bf16 is slower: a
    forward+backward of SmolLM2 on 8 x 250 tokens takes 10 s instead of 27 s on one core
    of an AMD EPYC with avx512_bf16, but 13.6 s against 8.4 s on 2 cores of an Intel Xeon
    whose flags also list avx512_bf16. At bf16 precision of the learner's logprobs. Off
    by default: the tiny policy's small matmuls gain nothing from it."""
    torch_threads: int = Field(default=0, ge=0)
    """CPU threads torch may use for training; 0: torch's own default (OMP_NUM_THREADS when
    set, else one per core). The demo gives the learner 2 on its 2-core machine: the
    generators wait at the pacing window while a step runs, and a SmolLM2 step on 6,000
    tokens takes 24 s on 2 threads against 37 s on 1 (benchmarks/learner_memory.py)."""
    share_prompt: bool = True
    """Micro-batches hold one prompt each (a group's samples share it), and a model that
    can (the Hugging Face backend) runs that prompt once for all its rows: the same
    logprobs and gradients as padding every row, with a group's prompt tokens computed
    once instead of group_size times (SmolLM2 in bf16, 4 groups of 8 x (110 + 40..120)
    tokens: 34 s -> 18 s a step on one core here)."""
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
    skip_no_signal: bool = True
    """Settle samples whose advantage is 0 (every member of a group whose rewards were all
    equal) without training on them (ledger: dropped, `no signal`): their policy gradient is
    exactly zero, so a batch then holds `batch_tokens` of samples that teach
    (learner/signal.py). Never skips production traces, nor anything while `kl_coef` or
    `entropy_coef` is on."""
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
    progress_every_s: float = Field(default=1.0, gt=0)
    """How often the learner announces its settled-sample count on `progress` (when it
    moved): generators pace on it, between weight publications too (DESIGN.md 7)."""
    publish_dtype: Literal["float32", "bfloat16"] = "float32"
    """Float dtype of published weight blobs: bfloat16 halves their size and the publish ->
    swap time; generators sampling in bfloat16 (sample_dtype) lose nothing by it."""
    weight_store: Literal["redis", "dir"] = "redis"
    """Where published weights go: `redis` (chunked; small models) or `dir` (large ones)."""
    weight_dir: Path | None = None
    """Root of the `dir` weight store (a shared mount for several hosts). Unset:
    `weights` under the stack's state_dir. On one host a tmpfs (`/dev/shm/...`) makes
    publish -> fetch -> swap of SmolLM2 in bf16 0.84 s instead of 1.25 s on disk (fsync is
    free; benchmarks/weight_sync.py); blobs there hold RAM (weight_keep of them) and do not
    survive a reboot, after which the learner re-publishes from its checkpoint."""
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
    lease_ttl_s: float = Field(default=10.0, gt=0)
    """One active learner per policy: the lease (Redis, with a fencing token) expires this
    long after its holder stops renewing it; a standby then takes over."""
    dedup_window: int = Field(default=100_000, ge=1)
    """Trajectory ids remembered (in checkpoints) to skip redelivered rewards."""
    tensorboard: bool = True
    """Write TensorBoard scalars when the tensorboard package is installed."""
    tensorboard_dir: Path | None = None
    """Where. Unset: `tensorboard/{prefix}` under the stack's state_dir."""
    metrics_port: int = Field(default=0, ge=0, le=65535)
    """Prometheus metrics on 127.0.0.1:PORT (0: off)."""


def configure(cls: type[D], section: LearnerSettings | None = None, /, **values: Any) -> D:
    """An instance of the dataclass `cls` whose fields named like `[learner]` keys take the
    section's values (the one source of their defaults), the other fields `values`.

    `section` defaults to the defaults; a value named like a section key updates a copy of
    it, validated as the section validates it (tests and benchmarks set knobs this way)."""
    base = section if section is not None else LearnerSettings()
    keys = LearnerSettings.model_fields.keys()
    own = {k: v for k, v in values.items() if k in keys}
    if own:
        base = LearnerSettings.model_validate({**base.model_dump(), **own})
    names = {f.name for f in fields(cls) if f.init}
    unknown = sorted(set(values) - names - own.keys())
    if unknown:
        raise TypeError(f"{cls.__name__} has no field {unknown}")
    taken = {n: getattr(base, n) for n in names if n in keys}
    return cls(**taken, **{k: v for k, v in values.items() if k not in keys})
