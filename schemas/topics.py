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

    def full_name(self, prefix: str) -> str:
        return f"{prefix}.{self.name}"

    def partition_count(self, group_partitions: int) -> int:
        return group_partitions if self.partitions == GROUP_PARTITIONS else self.partitions

    def configs(self) -> dict[str, str]:
        """Topic-level Kafka configs for creation."""
        if self.compacted:
            return {"cleanup.policy": "compact", "min.cleanable.dirty.ratio": "0.1"}
        return {"cleanup.policy": "delete", "retention.ms": str(self.retention_ms)}


TASKS: Final = TopicSpec("tasks", key="task_id", partitions=4, retention_ms=3 * DAY_MS)
TRAJECTORIES: Final = TopicSpec(
    "trajectories", key="group_id", partitions=GROUP_PARTITIONS, retention_ms=7 * DAY_MS
)
SANDBOX_REQUESTS: Final = TopicSpec(
    "sandbox.requests", key="request_id", partitions=4, retention_ms=1 * DAY_MS
)
SANDBOX_RESULTS: Final = TopicSpec(
    "sandbox.results", key="group_id", partitions=GROUP_PARTITIONS, retention_ms=1 * DAY_MS
)
REWARDS: Final = TopicSpec(
    "rewards", key="group_id", partitions=GROUP_PARTITIONS, retention_ms=7 * DAY_MS
)
WEIGHTS: Final = TopicSpec("weights", key="policy", partitions=1, retention_ms=-1, compacted=True)
LEDGER: Final = TopicSpec("ledger", key="trajectory_id", partitions=4, retention_ms=30 * DAY_MS)
DLQ: Final = TopicSpec("dlq", key="source_key", partitions=1, retention_ms=30 * DAY_MS)

ALL: Final[tuple[TopicSpec, ...]] = (
    TASKS,
    TRAJECTORIES,
    SANDBOX_REQUESTS,
    SANDBOX_RESULTS,
    REWARDS,
    WEIGHTS,
    LEDGER,
    DLQ,
)
BY_NAME: Final[dict[str, TopicSpec]] = {t.name: t for t in ALL}
