"""Prometheus metrics of the generators (exported when generator.metrics_port > 0)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge

GROUPS = Counter("rollstream_generator_groups_total", "Groups sampled and published")
TRAJECTORIES = Counter("rollstream_generator_trajectories_total", "Trajectories published")
TOKENS = Counter("rollstream_generator_tokens_total", "Prompt + completion tokens published")
VERSION = Gauge("rollstream_generator_policy_version", "Policy version loaded")
SWAPS = Counter("rollstream_generator_weight_swaps_total", "Weight versions loaded mid-run")
WEIGHT_FAILURES = Counter(
    "rollstream_generator_weight_failures_total", "Announced weights refused (old ones kept)"
)
PACED = Counter("rollstream_generator_paced_seconds_total", "Seconds waited by pacing")
OUTSTANDING = Gauge(
    "rollstream_generator_outstanding", "Trajectories published and not yet consumed"
)
DEAD_LETTERS = Counter("rollstream_generator_dead_letters_total", "Records sent to the DLQ")
