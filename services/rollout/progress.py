"""The generator's view of `progress`: pacing's one count (services/rollout/pacing.py).

Reads the compacted `progress` topic from the beginning: the learner's settled-sample
count of the policy (`learner/{policy}`) and every generator's produced count
(`generator/{id}`, this run's and earlier ones'). `announce(produced)` publishes this
generator's own count after each acknowledged group. Undecodable records get a dead
letter; other policies' counts are ignored.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from schemas import codec, topics
from schemas.learning import Progress
from services import kafka

if TYPE_CHECKING:
    from aiokafka import AIOKafkaProducer

    from services.settings import Settings

log = logging.getLogger("rollstream.generator.progress")


@dataclass
class ProgressBoard:
    settings: Settings
    generator_id: str
    dead_letters: kafka.DeadLetters
    consumed: int = 0
    """The learner's newest settled count of generated samples (the highest seen)."""
    produced: dict[str, int] = field(default_factory=dict)
    """Produced count per generator source, as last announced (the highest seen)."""
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    _follower: kafka.Follower | None = None

    @property
    def source(self) -> str:
        return f"generator/{self.generator_id}"

    @property
    def topic(self) -> str:
        return kafka.topic(self.settings, topics.PROGRESS)

    def others_produced(self) -> int:
        """Trajectories the other generators announced (this one's own count is exact)."""
        return sum(n for src, n in self.produced.items() if src != self.source)

    async def start(self) -> None:
        self._follower = kafka.Follower(
            self.settings, f"rollstream-generator-progress-{self.generator_id}", [self.topic]
        )
        await self._follower.start(self._batch)

    async def stop(self) -> None:
        if self._follower is not None:
            await self._follower.stop()

    async def announce(self, producer: AIOKafkaProducer, produced: int) -> None:
        msg = Progress(source=self.source, policy=self.settings.learner.policy, produced=produced)
        await producer.send_and_wait(self.topic, codec.encode(msg), key=self.source.encode())

    async def _batch(self, records: list[kafka.KafkaRecord]) -> None:
        for rec in records:
            if rec.value is None:
                continue  # a tombstone
            try:
                msg = codec.decode(rec.value, Progress)
            except codec.SchemaError as exc:
                await self.dead_letters.send(rec, f"undecodable Progress: {exc}", exc)
                continue
            self._take(msg)

    def _take(self, msg: Progress) -> None:
        if msg.policy != self.settings.learner.policy:
            return
        if msg.source.startswith("learner/"):
            if msg.samples_consumed > self.consumed:
                self.consumed = msg.samples_consumed
                self.changed.set()
        elif msg.produced > self.produced.get(msg.source, -1):
            self.produced[msg.source] = msg.produced
            self.changed.set()
