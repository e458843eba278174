"""Learner metrics: Prometheus registry values and TensorBoard event files."""

from __future__ import annotations

from pathlib import Path

import pytest

from learner.metrics import LearnerMetrics


def test_prometheus_and_tensorboard(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard")
    m = LearnerMetrics(port=0, tensorboard_dir=tmp_path)
    stats = {"loss": 0.5, "clip_frac": 0.1, "tokens_per_s": 1234.0, "reward_mean": 0.25}
    m.step(3, 1, stats, lags=[0, 1, 1, 4], tokens=512)
    m.fate("trained", 4)
    m.fate("dropped")
    m.published(7, 0.02)
    m.close()
    value = m.registry.get_sample_value
    assert value("rollstream_learner_loss") == 0.5
    assert value("rollstream_learner_steps_total") == 1
    assert value("rollstream_learner_tokens_total") == 512
    assert value("rollstream_learner_samples_total", {"status": "trained"}) == 4
    assert value("rollstream_learner_policy_version") == 7
    assert value("rollstream_learner_staleness_versions_bucket", {"le": "1.0"}) == 3
    assert list(tmp_path.glob("events.out.tfevents.*"))
