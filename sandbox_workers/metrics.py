"""Prometheus metrics of the sandbox worker (exported when sandbox.worker_metrics_port > 0)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

_SECONDS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)

REQUESTS = Counter("rollstream_sandbox_requests_total", "sandbox.requests records consumed")
RESULTS = Counter(
    "rollstream_sandbox_results_total", "Results published, by outcome and verifier",
    ["outcome", "verifier"],
)  # fmt: skip
DEAD_LETTERS = Counter("rollstream_sandbox_dead_letters_total", "Requests sent to the DLQ")
DUPLICATES = Counter(
    "rollstream_sandbox_duplicates_total", "Requests skipped: request_id+attempt already answered"
)
JOB_SECONDS = Histogram(
    "rollstream_sandbox_job_seconds", "Wall time of a job inside the sandbox", buckets=_SECONDS
)
QUEUE_SECONDS = Histogram(
    "rollstream_sandbox_queue_seconds", "Request created -> job started", buckets=_SECONDS
)
INFLIGHT = Gauge("rollstream_sandbox_inflight", "Requests consumed and not yet published")
TRANSACTIONS = Counter("rollstream_sandbox_transactions_total", "Committed Kafka transactions")
TRANSACTION_ERRORS = Counter(
    "rollstream_sandbox_transaction_errors_total", "Kafka transactions that failed (retried)"
)
CONTAINERS_REPLACED = Gauge(
    "rollstream_sandbox_containers_replaced", "Pool containers destroyed and replaced so far"
)
