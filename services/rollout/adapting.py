"""`feeder.adapt`: the feeder follows `rewards` and moves its sampling weights. A task whose
group got equal rewards (no learning signal) is sampled less (sampler.task_multiplier), and
unless `feeder.adapt_suites` is off so is a suite whose recent groups did
(sampler.adapt_multipliers)."""

from __future__ import annotations

import collections
from typing import TYPE_CHECKING, Any

from schemas import topics
from schemas.codec import SchemaError
from schemas.rollout import ScoredTrajectory
from services import kafka
from services.rollout.sampler import GroupTally, SuiteSampler, observe_group

if TYPE_CHECKING:
    from services.settings import Settings


async def follow_rewards(
    settings: Settings, claim: Any, sampler: SuiteSampler, floor: float
) -> None:
    """Follow `rewards` (from now on) and update the sampler's multipliers, until cancelled.
    `claim`: the claim-check client that unpacks records."""
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
                if done is not None:
                    group = (t.task_id, t.suite, done)
                    observe_group(sampler, history, group, floor, settings.feeder.adapt_suites)
    finally:
        await consumer.stop()
