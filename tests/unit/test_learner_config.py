"""`learner.config.configure`: the inner configs take their values from `[learner]`."""

from __future__ import annotations

import pydantic
import pytest

from learner.config import LearnerSettings, configure
from learner.loop import LoopConfig
from learner.loss import LossConfig
from learner.trainer import train_config


def test_inner_configs_take_the_section_values() -> None:
    section = LearnerSettings(lr=1e-2, clip_eps=0.1, micro_batch_tokens=64)
    cfg = train_config(section)
    assert (cfg.lr, cfg.micro_batch_tokens, cfg.loss.clip_eps) == (1e-2, 64, 0.1)
    assert cfg.loss.rwl_max_weight == LearnerSettings().rwl_max_weight


def test_overrides_are_validated_as_the_section_validates_them() -> None:
    assert configure(LossConfig, is_cap=3.0).is_cap == 3.0
    with pytest.raises(pydantic.ValidationError):
        configure(LossConfig, clip_eps=2.0)


def test_unknown_fields_are_refused() -> None:
    with pytest.raises(TypeError, match="no field"):
        configure(LossConfig, no_such_knob=1)


def test_loop_config_needs_its_topics() -> None:
    with pytest.raises(TypeError):
        configure(LoopConfig)
    cfg = configure(
        LoopConfig, rewards_topic="r", weights_topic="w", ledger_topic="l", dlq_topic="d"
    )
    assert cfg.max_lag == LearnerSettings().max_lag
