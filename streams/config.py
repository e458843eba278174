"""Settings section owned by the reward dispatcher: `[dispatcher]`. The one place its
defaults and docs live."""

from __future__ import annotations

from typing import Literal  # noqa: F401

from pydantic import BaseModel, ConfigDict, Field


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)


class DispatcherSettings(Section):
    """The reward dispatcher (faust app, streams/)."""

    request_deadline_s: float = Field(default=120.0, gt=0)
    """A sandbox result missing this long after its request is retried (then masked)."""
    max_attempts: int = Field(default=3, ge=1, le=10)
    """Attempts per sandbox request (sandbox_error or missing result) before masking."""
    group_deadline_s: float = Field(default=600.0, gt=0)
    """A group still incomplete this long after its first member is emitted partially."""
    tombstone_ttl_s: float = Field(default=3600.0, ge=0)
    """How long an emitted group's member ids are kept to reject redeliveries."""
    tick_interval_s: float = Field(default=1.0, gt=0)
    """How often deadlines are checked."""
    sandbox_timeout_s: float = Field(default=10.0, gt=0)
    """Wall-clock limit of each sandbox job the dispatcher requests."""
    sandbox_memory_mb: int = Field(default=256, ge=16)
    """Memory limit of each sandbox job the dispatcher requests."""
    group_state_bytes: int = Field(default=512 * 1024, ge=16 * 1024, le=900 * 1024)
    """Most trajectory bytes a group's table value keeps inline: a member larger than this
    divided by group_size is kept as a claim-check reference instead (faust's producer
    refuses changelog records over about 1 MB)."""
    batch_max: int = Field(default=1000, ge=1, le=10000)
    """Most events handled per batch: the events already queued when the agent is free
    (all their sends share one wait for Kafka's acks; none is waited for)."""
    batch_gather_s: float = Field(default=0.0, ge=0, le=0.1)
    """When no more events are queued, wait this long once for a trickle to join the
    batch (0: never wait; a lone event is then a batch of one). benchmarks/dispatcher.py
    measured 0.44x the plain loop at 0 against 0.18x at 0.003 s. (The scale-out stalls once
    seen at 0 were faust's clear-on-resume losing fetched events: streams/app.py
    keep_fetched_on_resume.)"""
    batches_in_flight: int = Field(default=4, ge=1, le=64)
    """Batches sent but not yet acked at once (they settle in order)."""
    stream_buffer: int = Field(default=16384, ge=256, le=262144)
    """Fetched events the agent's queue holds (faust's stream_buffer_maxsize): past
    1/1.25 of it faust pauses fetching those partitions until it drains to 0.4 of it.
    faust's 4096 made a dispatcher under a backlog pause and resume all the time:
    benchmarks/dispatcher.py --n 40000 measured 0.49x the plain loop at 4096, 0.74x at
    16384. Memory: up to this many records (plus batch_max x batches_in_flight in
    flight), each up to blobs.inline_limit_bytes (larger ones travel as claim checks)."""
    metrics_port: int = Field(default=0, ge=0, le=65535)
    """Prometheus metrics on 127.0.0.1:PORT (0: off)."""
    log_level: str = "warning"
    """Log level of the faust worker."""
    changelog_replication: int = Field(default=0, ge=0, le=5)
    """Replication of the group table's changelog topic; 0: like the run's topics on the
    live cluster (3 on 3 or more brokers, else 1; resolved when the dispatcher starts)."""
