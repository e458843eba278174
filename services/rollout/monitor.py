"""The demo's eyes on the run: reads every topic of the prefix from the beginning and
keeps `RunStats` and the id sets of the accounting (published, scored, ledger)."""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from schemas import codec, topics
from schemas.codec import SchemaError
from schemas.learning import LedgerEntry, WeightUpdate
from schemas.rollout import ScoredTrajectory, Trajectory
from schemas.sandbox import Outcome
from services import kafka
from services.rollout.stats import RunStats

if TYPE_CHECKING:
    from services.settings import Settings

log = logging.getLogger("rollstream.demo.monitor")
WATCHED = (topics.TRAJECTORIES, topics.REWARDS, topics.WEIGHTS, topics.LEDGER, topics.DLQ)


class Monitor:
    def __init__(self, settings: Settings, stats: RunStats) -> None:
        self.settings = settings
        self.stats = stats
        self.published: set[str] = set()
        self.scored: set[str] = set()
        self.versions_sampled: set[int] = set()
        self.undecodable = 0
        self.names = {kafka.topic(settings, spec): spec.name for spec in WATCHED}
        self._follower = kafka.Follower(
            settings, "rollstream-demo-monitor", list(self.names), timeout_ms=300, max_records=5000
        )
        self._claim: Any = None

    async def start(self) -> None:
        from services import blobs

        self._claim = blobs.from_settings(self.settings)
        await self._follower.start(self._batch)

    async def stop(self) -> None:
        await self._follower.stop()
        if self._claim is not None:
            await self._claim.aclose()

    async def _batch(self, records: list[kafka.KafkaRecord]) -> None:
        now = time.time()
        for rec in records:
            try:
                await self._one(self.names[rec.topic], rec.value or b"", now)
            except SchemaError:
                self.undecodable += 1  # the consumers dead-letter these

    async def _one(self, name: str, value: bytes, now: float) -> None:
        s = self.stats
        if name == topics.TRAJECTORIES.name:
            traj = await self._claim.unpack(value, Trajectory)
            if traj.id not in self.published:
                self.published.add(traj.id)
                self.versions_sampled.add(traj.policy_version)
                s.on_trajectory(now)
        elif name == topics.REWARDS.name:
            r = await self._claim.unpack(value, ScoredTrajectory)
            if r.trajectory.id not in self.scored:
                self.scored.add(r.trajectory.id)
                t = r.trajectory
                passed = r.outcome == Outcome.PASSED
                group = (t.group_id, t.group_size)
                s.on_reward(now, t.suite, r.reward, t.policy_version, r.masked, passed, group)
        elif name == topics.WEIGHTS.name:
            u = codec.decode(value, WeightUpdate)
            s.on_weights(u.version, u.samples_consumed)
        elif name == topics.LEDGER.name:
            e = codec.decode(value, LedgerEntry)
            s.on_ledger(e.trajectory_id, e.status.value, e.reason)
        else:
            s.on_dead_letter()

    def unaccounted(self) -> int:
        """Published trajectories with no ledger entry yet."""
        return sum(1 for tid in self.published if tid not in self.stats.ledger)
