"""Prometheus metrics of the ingest gateway (exported when ingest.metrics_port > 0)."""

from __future__ import annotations

from prometheus_client import Counter

TRACES = Counter(
    "rollstream_ingest_traces_total",
    "Traces accepted, by where they went (awaiting_feedback, scoring, scored) or duplicate",
    ["status"],
)
FEEDBACK = Counter(
    "rollstream_ingest_feedback_total", "Feedback accepted, by source of the reward", ["source"]
)
REFUSED = Counter(
    "rollstream_ingest_refused_total", "Requests answered with an error, by status", ["status"]
)
