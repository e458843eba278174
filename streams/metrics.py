"""Prometheus metrics of the reward dispatcher (exported when dispatcher.metrics_port > 0)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

TRAJECTORIES_IN = Counter("rollstream_dispatcher_trajectories_total", "Trajectory records read")
REWARDS_OUT = Counter("rollstream_dispatcher_rewards_total", "ScoredTrajectory records emitted")
DLQ = Counter("rollstream_dispatcher_dead_letters_total", "Records sent to the DLQ")
OUTCOMES = Counter(
    "rollstream_dispatcher_outcomes_total", "Sandbox results by outcome", ["outcome"]
)
INFLIGHT = Gauge("rollstream_dispatcher_inflight_groups", "Groups not yet emitted (local)")
LATENCY = Histogram(
    "rollstream_dispatcher_latency_seconds",
    "Trajectory created -> reward emitted",
    buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300),
)
