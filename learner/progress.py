"""The learner's progress announcements: pacing's count (DESIGN.md 7, refined in CHANGELOG).

Every `learner.progress_every_s`, when it has moved, the learner's count of settled
generated samples (trained, dropped as stale or invalid, masked) goes out as a `Progress`
on the compacted `progress` topic, keyed `learner/{policy}`, on its own cadence: it moves
when every in-flight sample is dropped as stale and no step (so no weights publication)
happens, so generators waiting on it never stall. A restarted learner redoes the work
after its checkpoint and counts it again (generators keep the highest count they saw):
the window is then over-admitted by at most the redone samples, never stalled.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Protocol

from schemas import codec
from schemas.learning import Progress

log = logging.getLogger(__name__)


class Counts(Protocol):
    """What is announced: the loop's counters (learner.loop.Learner)."""

    generated_consumed: int
    version: int


class Sender(Protocol):
    async def send_and_wait(
        self, topic: str, value: bytes | None = None, key: bytes | None = None
    ) -> object: ...


def message(policy: str, counts: Counts) -> Progress:
    return Progress(
        source=f"learner/{policy}",
        policy=policy,
        samples_consumed=counts.generated_consumed,
        version=counts.version,
    )


async def announce(
    counts: Counts, io: Sender, topic: str, policy: str, every_s: float, stop: asyncio.Event
) -> None:
    """Announce `counts` every `every_s` while it moves, until `stop` (then once more)."""
    last: tuple[int, int] | None = None
    while True:
        now = (counts.generated_consumed, counts.version)
        if now != last:
            try:
                msg = message(policy, counts)
                await io.send_and_wait(topic, value=codec.encode(msg), key=msg.source.encode())
                last = now
            except Exception as exc:  # pacing degrades, training goes on
                log.warning("progress announcement failed: %s", exc)
        if stop.is_set():
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), every_s)


class Announcer:
    """The announcements of one learner: its topic, policy and cadence."""

    def __init__(self, topic: str, policy: str, every_s: float) -> None:
        self.topic, self.policy, self.every_s = topic, policy, every_s
        self.stop = asyncio.Event()

    async def run(self, counts: Counts, io: Sender) -> None:
        await announce(counts, io, self.topic, self.policy, self.every_s, self.stop)
