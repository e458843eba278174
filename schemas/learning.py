"""Messages around the learner: weight announcements, the ledger, production feedback
(DESIGN.md sections 3, 6, 8)."""

from __future__ import annotations

import enum
import math
from typing import Annotated

import msgspec

from schemas.envelope import Message
from schemas.fields import Count, Key, Sha256Hex


class WeightUpdate(Message, kw_only=True):
    """A new policy version is in the weight store. Topic `weights` (compacted), key policy.
    An announcement only: the weights themselves are a blob at `uri`."""

    policy: Key
    """Policy name; the Kafka key, so compaction keeps the latest version per policy.
    writer: learner; reader: generator."""
    version: Count
    """Policy version, increasing by one per publication. writer: learner; reader:
    generator (stamps trajectories with it), learner (staleness)."""
    step: Count
    """Optimizer steps taken when these weights were saved. writer: learner; reader:
    operators, TensorBoard."""
    uri: str
    """Where the weights are (redis://..., file://..., s3://...). writer: learner; reader:
    generator (fetches them)."""
    sha256: Sha256Hex
    """SHA-256 of the blob at `uri`; readers verify before loading. writer: learner;
    reader: generator."""
    size_bytes: Count
    """Size of the blob. writer: learner; reader: generator (sanity check, progress)."""
    format: str = "safetensors"
    """Serialization of the blob; only safetensors today (never pickle). writer: learner;
    reader: generator."""
    samples_consumed: Count = 0
    """Rewards the learner has consumed so far; generators pace on it (DESIGN.md 7).
    writer: learner; reader: generator (admission control)."""


class LedgerStatus(enum.StrEnum):
    """The fate of a trajectory."""

    TRAINED = "trained"
    DROPPED = "dropped"
    MASKED = "masked"


class LedgerEntry(Message, kw_only=True):
    """The fate of one trajectory. Topic `ledger`, key trajectory_id. `rollstream audit`
    checks every published trajectory has exactly one entry (trained once, or not with a
    reason)."""

    trajectory_id: Key
    """Id of the trajectory (its envelope id). writer: learner, dispatcher; reader: audit."""
    group_id: str = ""
    """Its group. writer: learner, dispatcher; reader: audit."""
    status: LedgerStatus
    """trained | dropped | masked. writer: learner, dispatcher; reader: audit."""
    reason: str = ""
    """Why dropped or masked (stale: lag 5 > max_lag 4; sandbox_error after 3 attempts).
    Required unless trained. writer: learner, dispatcher; reader: audit, people."""
    policy_version: Annotated[int, msgspec.Meta(ge=-1)] = -1
    """Policy version the trajectory was sampled with. writer: learner; reader: audit."""
    learner_step: Annotated[int, msgspec.Meta(ge=-1)] = -1
    """Optimizer step that trained on it; -1 when not trained. writer: learner; reader:
    audit."""
    writer: str = ""
    """Process that wrote the entry (learner-0, dispatcher-1 ...). writer: learner,
    dispatcher; reader: operators."""

    def __post_init__(self) -> None:
        if self.status is not LedgerStatus.TRAINED and not self.reason:
            raise ValueError(f"a {self.status.value} ledger entry needs a reason")


class Feedback(Message, kw_only=True):
    """A person's or a system's judgement of a production trace. Topic `feedback`, key
    trace_id. The ingest gateway publishes it and joins it to the trace itself (the reward
    goes on `rewards`), so nothing has to consume this topic to train; it is the record."""

    trace_id: Key
    """Id of the trajectory (origin=production) this judges. writer: ingest; reader:
    audit, export (the reward was joined by the gateway)."""
    score: float | None = None
    """Numeric score (finite), scale set by the deployment. writer: ingest; reader:
    ingest (the reward map), people."""
    label: str | None = None
    """Categorical label (correct, harmful ...). writer: ingest; reader: ingest, people."""
    thumbs: Annotated[int, msgspec.Meta(ge=-1, le=1)] | None = None
    """-1 thumbs down, 0 neutral, 1 thumbs up. writer: ingest; reader: ingest, people."""
    comment: str = ""
    """Free text. writer: ingest; reader: people."""

    def __post_init__(self) -> None:
        if self.score is not None and not math.isfinite(self.score):
            raise ValueError(f"score {self.score} must be finite")
        if self.score is None and self.label is None and self.thumbs is None and not self.comment:
            raise ValueError("Feedback needs a score, a label, thumbs or a comment")


class Progress(Message, kw_only=True):
    """Pacing's one count (DESIGN.md 7, refined in CHANGELOG). Topic `progress`
    (compacted), key `source`: the learner announces how many generated samples it has
    settled, each generator how many trajectories it has produced for the learner; a
    generator paces on (sum of the generators' `produced`) - (the learner's
    `samples_consumed`), two counts of the same things."""

    source: Key
    """`learner/{policy}` or `generator/{generator id}`; the Kafka key, so compaction keeps
    the newest count of each writer. writer: learner, generator; reader: generator."""
    policy: Key
    """Policy name. writer: learner, generator; reader: generator (other policies'
    counts are ignored)."""
    samples_consumed: Count = 0
    """Learner: generated samples (policy version >= 0) it has settled so far, trained,
    dropped or masked; production traces are not counted. writer: learner; reader:
    generator (pacing)."""
    produced: Count = 0
    """Generator: trajectories it has published on `trajectories` (whole groups,
    acknowledged) since it started. writer: generator; reader: generator (pacing)."""
    version: int = -1
    """Learner: the newest policy version it has published. writer: learner; reader:
    operators."""
