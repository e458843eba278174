"""`feeder.adapt`: the feeder follows `rewards` and moves its sampling weights. A suite whose
recent groups all got equal rewards (no learning signal) is sampled less
(sampler.adapt_multipliers), and so is a task whose group did (sampler.task_multiplier)."""

from __future__ import annotations

import collections
from typing import TYPE_CHECKING, Any

from schemas import topics
from schemas.codec import SchemaError
from schemas.rollout import ScoredTrajectory
from services import kafka
from services.rollout.sampler import GroupTally, SuiteSampler, adapt_multipliers, task_multiplier

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
                    history.setdefault(t.suite, collections.deque(maxlen=50)).append(done)
                    chances = sampler.task_multipliers
                    old = chances.get(t.task_id, 1.0)
                    chances[t.task_id] = task_multiplier(old, done, floor)
            sampler.multipliers = adapt_multipliers(history, floor)
    finally:
        await consumer.stop()
