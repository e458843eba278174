"""Learner metrics: Prometheus (pull, on 127.0.0.1:PORT) and TensorBoard scalars.

Both are optional: Prometheus when a port is configured, TensorBoard when a directory is
configured and the `tensorboard` package is installed (one warning otherwise). Each
`LearnerMetrics` owns its Prometheus registry, so several learners (tests) can coexist.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

GAUGES = {
    "loss": "Loss of the last update",
    "reward_mean": "Mean reward of the last batch",
    "advantage_mean": "Mean advantage of the last batch",
    "ratio_mean": "Mean behaviour ratio pi_theta / mu of the last batch",
    "ratio_max": "Largest behaviour ratio of the last batch",
    "is_weight_mean": "Mean truncated importance weight of the last batch",
    "clip_frac": "Fraction of tokens where the PPO clip was active",
    "trunc_frac": "Fraction of tokens whose importance weight was truncated",
    "masked_seq_frac": "Fraction of sequences masked for extreme ratios",
    "entropy": "Mean token entropy of the last batch",
    "kl": "Mean KL to the reference policy",
    "grad_norm": "Gradient norm before clipping",
    "tokens_per_s": "Tokens per second of the last update",
    "wait_frac": "Fraction of wall time spent waiting for data",
}


class LearnerMetrics:
    def __init__(self, port: int = 0, tensorboard_dir: Path | None = None) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.registry = CollectorRegistry()
        r = self.registry
        self.gauges = {
            k: Gauge(f"rollstream_learner_{k}", doc, registry=r) for k, doc in GAUGES.items()
        }
        self.steps = Counter("rollstream_learner_steps_total", "Optimizer steps", registry=r)
        self.tokens = Counter("rollstream_learner_tokens_total", "Tokens trained on", registry=r)
        self.samples = Counter(
            "rollstream_learner_samples_total", "Samples by fate", ["status"], registry=r
        )
        self.version = Gauge("rollstream_learner_policy_version", "Published version", registry=r)
        self.staleness = Histogram(
            "rollstream_learner_staleness_versions",
            "Policy versions between a trained sample and the learner",
            buckets=(0, 1, 2, 3, 4, 6, 8, 16),
            registry=r,
        )
        self.publish_seconds = Histogram(
            "rollstream_learner_publish_seconds", "Weight store put + announcement", registry=r
        )
        self.server: Any = None
        if port:
            from prometheus_client import start_http_server

            self.server = start_http_server(port, addr="127.0.0.1", registry=r)
        self.tb: Any = None
        if tensorboard_dir is not None:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self.tb = SummaryWriter(str(tensorboard_dir))
            except ImportError:
                log.warning("tensorboard is not installed: no TensorBoard scalars")

    def step(
        self, step: int, n_steps: int, stats: dict[str, float], lags: list[int], tokens: int
    ) -> None:
        self.steps.inc(n_steps)
        for key, gauge in self.gauges.items():
            if key in stats:
                gauge.set(stats[key])
        self.tokens.inc(tokens)
        for lag in lags:
            self.staleness.observe(lag)
        if self.tb is not None:
            for key, value in stats.items():
                self.tb.add_scalar(f"learner/{key}", value, step)
            if lags:
                import numpy as np

                self.tb.add_histogram("learner/staleness", np.asarray(lags), step)

    def fate(self, status: str, n: int = 1) -> None:
        self.samples.labels(status=status).inc(n)

    def published(self, version: int, seconds: float) -> None:
        self.version.set(version)
        self.publish_seconds.observe(seconds)

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()
        if self.server is not None:
            server, thread = self.server
            server.shutdown()
            server.server_close()
            thread.join(timeout=5)
