"""Feedback to reward (pure): the gateway is the verifier of traces judged by people or
systems, so it turns a judgement into the ScoredTrajectory the learner trains on.

Reward, in [0, 1], from the first of these the feedback has:

- `score`: linearly from [ingest.score_min, ingest.score_max] to [0, 1];
- `thumbs`: up 1.0, neutral 0.5, down 0.0;
- `label`: its reward in ingest.label_rewards.

Advantage = (reward - ingest.baseline) / ingest.advantage_scale (by default -1 for the
worst judgement, +1 for the best). A production trace is a group of one, so there is no
group to be relative to: the baseline stands in for the group mean. The learner trains
such traces (no behaviour logprobs) through its reward-weighted likelihood term, with
weight min(exp(advantage / rwl_beta), rwl_max_weight): better-judged traces pull harder.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass, field

from schemas.envelope import Origin
from schemas.learning import Feedback
from schemas.rollout import ScoredTrajectory, Trajectory
from schemas.sandbox import Outcome
from services.ingest.convert import FEEDBACK_VERIFIER, FEEDBACK_VERIFIER_VERSION, Invalid
from services.ingest.models import Judgement
from services.settings import IngestSettings

THUMBS_REWARD = {1: 1.0, 0: 0.5, -1: 0.0}


@dataclass(frozen=True)
class Verdict:
    reward: float
    advantage: float
    source: str
    """score | thumbs | label: what the reward came from."""
    components: dict[str, float] = field(default_factory=dict)


def judge(j: Judgement, cfg: IngestSettings) -> Verdict:
    """The reward and advantage of a judgement; Invalid when it has none to give."""
    if j.score is not None:
        lo, hi = cfg.score_min, cfg.score_max
        if not lo <= j.score <= hi:
            raise Invalid([f"score: {j.score} is outside [{lo}, {hi}] (ingest.score_min/max)"])
        reward, source = (j.score - lo) / (hi - lo), "score"
    elif j.thumbs is not None:
        reward, source = THUMBS_REWARD[j.thumbs], "thumbs"
    elif j.label is not None:
        labels = cfg.label_map()
        if j.label not in labels:
            known = ", ".join(sorted(labels)) or "none configured"
            raise Invalid([f"label: {j.label!r} has no reward (known labels: {known})"])
        reward, source = labels[j.label], "label"
    else:
        raise Invalid(["score, thumbs, label: send at least one (a comment alone is no reward)"])
    advantage = (reward - cfg.baseline) / cfg.advantage_scale
    components = {"feedback": reward}
    if j.score is not None:
        components["score"] = j.score
    if j.thumbs is not None:
        components["thumbs"] = float(j.thumbs)
    return Verdict(reward, advantage, source, components)


def writer() -> str:
    return f"ingest@{socket.gethostname()}"


def feedback_message(feedback_id: str, trace_id: str, j: Judgement) -> Feedback:
    return Feedback(
        id=feedback_id,
        origin=Origin.PRODUCTION,
        parent_id=trace_id,
        trace_id=trace_id,
        score=j.score,
        label=j.label,
        thumbs=j.thumbs,
        comment=j.comment,
    )


def scored(traj: Trajectory, v: Verdict, baseline: float, by: str) -> ScoredTrajectory:
    """The reward message of a trace judged by feedback (its id is deterministic, as the
    dispatcher's are, so a re-sent one is recognised)."""
    from streams.groups import scored_id

    good = v.reward > baseline
    return ScoredTrajectory(
        id=scored_id(traj.id),
        origin=Origin.PRODUCTION,
        parent_id=traj.id,
        trajectory=traj,
        reward=v.reward,
        advantage=v.advantage,
        outcome=Outcome.PASSED if good else Outcome.FAILED,
        passed=int(good),
        total=1,
        components=v.components,
        group_size_scored=1,
        dispatcher_id=by,
        verifier_name=FEEDBACK_VERIFIER,
        verifier_version=FEEDBACK_VERIFIER_VERSION,
    )
