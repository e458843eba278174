"""Topic registry: every topic's name, key, partitions, retention and compaction, declared once.

A topic's full name is ``{prefix}.{name}``; the prefix is the run's (settings
``topics.prefix``), so several experiments share one cluster. Topics keyed by group_id
share one partition count (``topics.partitions``) so that the process owning a group's
state sees all of that group's messages (co-partitioning, DESIGN.md section 1).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

DAY_MS: Final = 24 * 3600 * 1000
GROUP_PARTITIONS: Final = -1
"""Sentinel partition count: use the run's group-keyed partition count."""


@dataclass(frozen=True, slots=True)
class TopicSpec:
    """One topic of DESIGN.md section 1."""

    name: str
    """Name after the run prefix, for example ``sandbox.requests``."""
    key: str
    """The message field used as the Kafka key."""
    partitions: int
    """Partition count, or GROUP_PARTITIONS for the co-partitioned group-keyed topics."""
    retention_ms: int
    """How long records are kept (-1: forever)."""
    compacted: bool = False
    """Log compaction (latest record per key kept) instead of deletion by time."""
    schemas: tuple[str, ...] = ()
    """Message schemas published on the topic (besides BlobRef, which may stand in for any
    of them); a consumer dead-letters anything else."""

    def full_name(self, prefix: str) -> str:
        return f"{prefix}.{self.name}"

    def partition_count(self, group_partitions: int) -> int:
        return group_partitions if self.partitions == GROUP_PARTITIONS else self.partitions

    def configs(self) -> dict[str, str]:
        """Topic-level Kafka configs for creation."""
        if self.compacted:
            return {"cleanup.policy": "compact", "min.cleanable.dirty.ratio": "0.1"}
        return {"cleanup.policy": "delete", "retention.ms": str(self.retention_ms)}


TASKS: Final = TopicSpec(
    "tasks", key="task_id", partitions=4, retention_ms=3 * DAY_MS, schemas=("Task",)
)
TRAJECTORIES: Final = TopicSpec(
    "trajectories",
    key="group_id",
    partitions=GROUP_PARTITIONS,
    retention_ms=7 * DAY_MS,
    schemas=("Trajectory",),
)
SANDBOX_REQUESTS: Final = TopicSpec(
    "sandbox.requests",
    key="request_id",
    partitions=4,
    retention_ms=1 * DAY_MS,
    schemas=("SandboxRequest",),
)
SANDBOX_RESULTS: Final = TopicSpec(
    "sandbox.results",
    key="group_id",
    partitions=GROUP_PARTITIONS,
    retention_ms=1 * DAY_MS,
    schemas=("SandboxResult",),
)
REWARDS: Final = TopicSpec(
    "rewards",
    key="group_id",
    partitions=GROUP_PARTITIONS,
    retention_ms=7 * DAY_MS,
    schemas=("ScoredTrajectory",),
)
WEIGHTS: Final = TopicSpec(
    "weights",
    key="policy",
    partitions=1,
    retention_ms=-1,
    compacted=True,
    schemas=("WeightUpdate",),
)
PROGRESS: Final = TopicSpec(
    "progress",
    key="source",
    partitions=1,
    retention_ms=-1,
    compacted=True,
    schemas=("Progress",),
)
"""Pacing counts: the learner's settled samples, each generator's produced trajectories."""
LEDGER: Final = TopicSpec(
    "ledger", key="trajectory_id", partitions=4, retention_ms=30 * DAY_MS, schemas=("LedgerEntry",)
)
DLQ: Final = TopicSpec(
    "dlq", key="source_key", partitions=1, retention_ms=30 * DAY_MS, schemas=("DeadLetter",)
)
FEEDBACK: Final = TopicSpec(
    "feedback", key="trace_id", partitions=4, retention_ms=30 * DAY_MS, schemas=("Feedback",)
)
"""Every judgement the ingest gateway accepted on a production trace, as received (the
gateway also joins it to its trace and publishes the reward on `rewards`)."""

ALL: Final[tuple[TopicSpec, ...]] = (
    TASKS,
    TRAJECTORIES,
    SANDBOX_REQUESTS,
    SANDBOX_RESULTS,
    REWARDS,
    WEIGHTS,
    PROGRESS,
    LEDGER,
    DLQ,
    FEEDBACK,
)
BY_NAME: Final[dict[str, TopicSpec]] = {t.name: t for t in ALL}


def key_for(spec: TopicSpec, msg: object) -> bytes | None:
    """The Kafka key of `msg` on `spec`'s topic: its `spec.key` attribute as UTF-8 (bytes
    as they are; None stays None, only the DLQ allows it). Use the message itself, not its
    claim-check BlobRef: the key of a claim-checked record is the inner message's key."""
    value = getattr(msg, spec.key, _MISSING)
    if value is _MISSING:
        raise ValueError(f"{type(msg).__name__} has no {spec.key!r}, the key of {spec.name}")
    if value is None or isinstance(value, bytes):
        if value is None and spec.name != DLQ.name:
            raise ValueError(f"{spec.name}: the key {spec.key!r} of {type(msg).__name__} is None")
        return value
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, int):
        return str(value).encode()
    raise ValueError(f"{spec.name}: key {spec.key!r} is a {type(value).__name__}")


_MISSING: Final = object()


@dataclass(frozen=True, slots=True)
class ConsumerGroup:
    """One consumer group of the pipeline; its full id is ``{prefix}.{name}`` (a policy's
    learner adds ``.{policy}``). Declared here, beside the topics it consumes."""

    name: str
    """Name after the run prefix, for example ``sandbox-workers``."""
    consumes: tuple[TopicSpec, ...]
    """The topics its members subscribe to."""
    per_policy: bool = False
    """One group per policy name (the learner): ``{prefix}.{name}.{policy}``."""

    def full_id(self, prefix: str, policy: str | None = None) -> str:
        if self.per_policy:
            if not policy:
                raise ValueError(f"consumer group {self.name} is per policy: name the policy")
            return f"{prefix}.{self.name}.{policy}"
        return f"{prefix}.{self.name}"

    def matches(self, prefix: str, group_id: str) -> bool:
        """Whether `group_id` is this group (any policy's, for a per-policy group)."""
        base = f"{prefix}.{self.name}"
        return group_id == base or (self.per_policy and group_id.startswith(base + "."))


GENERATORS: Final = ConsumerGroup("generators", consumes=(TASKS,))
"""Rollout generators share the tasks."""
SANDBOX_WORKERS: Final = ConsumerGroup("sandbox-workers", consumes=(SANDBOX_REQUESTS,))
"""Sandbox workers share the requests (transactional, read_committed). Their commits mark
the records answered past the committed offset in the metadata (schemas/answered.py)."""
DISPATCHER: Final = ConsumerGroup(
    "dispatcher", consumes=(TRAJECTORIES, SANDBOX_RESULTS)
)  # fmt: skip
"""The reward dispatcher's faust app id (faust names its group after the app)."""
LEARNER: Final = ConsumerGroup("learner", consumes=(REWARDS,), per_policy=True)
"""One learner group per policy."""
GROUPS: Final[tuple[ConsumerGroup, ...]] = (GENERATORS, SANDBOX_WORKERS, DISPATCHER, LEARNER)
