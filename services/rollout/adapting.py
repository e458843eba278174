"""`feeder.adapt` and `feeder.frontier`: the feeder follows `rewards` and moves its sampling
chances. With `adapt` a task whose group got equal rewards (no learning signal) is sampled
less (sampler.task_multiplier), and unless `feeder.adapt_suites` is off so is a suite whose
recent groups did (sampler.adapt_multipliers). With `frontier` every completed group also
refits how far the policy has moved from its calibrated pass rates
(services/rollout/frontier.py)."""

from __future__ import annotations

import collections
import logging
from typing import TYPE_CHECKING, Any

from schemas import topics
from schemas.codec import SchemaError
from schemas.rollout import ScoredTrajectory
from services import kafka
from services.rollout.sampler import GroupTally, SuiteSampler, informative, observe_group

if TYPE_CHECKING:
    from services.rollout.frontier import Frontier
    from services.settings import Settings

log = logging.getLogger("rollstream.feeder")
LOG_EVERY = 64
"""Groups between two log lines of the frontier's shift."""


async def follow_rewards(
    settings: Settings, claim: Any, sampler: SuiteSampler, frontier: Frontier | None = None
) -> None:
    """Follow `rewards` (from now on) and update the sampler's chances, until cancelled.
    `claim`: the claim-check client that unpacks records."""
    cfg = settings.feeder
    consumer = kafka.consumer(settings, "rollstream-feeder-rewards")
    await consumer.start()
    tally = GroupTally()
    history: dict[str, collections.deque[bool]] = {}
    rewards = kafka.topic(settings, topics.REWARDS)
    try:
        await kafka.assign_all(settings, consumer, [rewards], "end")
        while True:
            batches = await consumer.getmany(timeout_ms=1000)
            for rec in (r for rs in batches.values() for r in rs):
                try:
                    scored = await claim.unpack(rec.value or b"", ScoredTrajectory)
                except SchemaError:
                    continue  # the learner dead-letters bad rewards
                t = scored.trajectory
                done = tally.add(t.group_id, t.suite, t.group_size, scored.reward)
                if done is None:
                    continue
                if cfg.adapt:
                    group = (t.task_id, t.suite, informative(done))
                    observe_group(sampler, history, group, cfg.adapt_floor, cfg.adapt_suites)
                if frontier is not None:
                    seen = frontier.observed
                    frontier.observe(t.task_id, done)
                    if frontier.observed != seen and frontier.observed % LOG_EVERY == 0:
                        log.info("feeder.frontier: shift %+.2f logits after %d groups",
                                 frontier.shift, frontier.observed)  # fmt: skip
    finally:
        await consumer.stop()
