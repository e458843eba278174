"""The reward dispatcher's handlers: what each agent of streams/app.py does with one
event, with no faust in it. Each handler decodes the record (claim check; bad data to the
DLQ with its reason), loads the group's state from the table, calls one pure function of
streams/groups.py, publishes the Effects and waits for Kafka's acks, and only then stores
the new state (see streams/app.py for the delivery argument).
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

import msgspec

from schemas import codec, topics
from schemas.codec import SchemaError
from schemas.deadletter import publish_dead_letter
from schemas.envelope import Message
from schemas.rollout import Trajectory
from schemas.sandbox import SandboxResult
from streams import groups, metrics
from streams.groups import Effects, GroupState, Policy

if TYPE_CHECKING:
    from streams.config import DispatcherSettings
    from streams.ports import ClaimChecks

log = logging.getLogger("rollstream.dispatcher")
M = TypeVar("M", bound=Message)
_STATE = msgspec.msgpack.Decoder(GroupState)
_ENCODE = msgspec.msgpack.Encoder()


@dataclass
class Dispatcher:
    """The handlers the agents call; everything but faust plumbing lives here."""

    section: DispatcherSettings
    prefix: str
    """The run's topic prefix."""
    claim_check: ClaimChecks
    table: Any
    """faust Table: group_id bytes -> encoded GroupState."""
    send: Any
    """async (topic, key, value) -> None, inside the current event's transaction."""
    score_result: groups.ScoreResult
    score_inline: groups.ScoreInline
    dispatcher_id: str = field(default_factory=lambda: f"{socket.gethostname()}:{os.getpid()}")

    @property
    def policy(self) -> Policy:
        return Policy.from_section(self.section)

    def topic(self, spec: topics.TopicSpec) -> str:
        return spec.full_name(self.prefix)

    def load(self, key: bytes) -> GroupState | None:
        raw = self.table.get(key)
        return None if raw is None else _STATE.decode(raw)

    def store(self, key: bytes, state: GroupState | None, delete: bool = False) -> None:
        if delete or state is None:
            self.table.pop(key, None)
        else:
            self.table[key] = _ENCODE.encode(state)

    async def on_trajectory(self, key: bytes | None, value: bytes | None, meta: Any) -> None:
        metrics.TRAJECTORIES_IN.inc()
        traj = await self._decode(value, Trajectory, key, meta)
        if traj is None:
            return
        if key != traj.group_id.encode():
            await self._dead(meta, key, value, f"record key {key!r} is not the group_id")
            return
        inline = None if traj.verifier.needs_sandbox else await self.score_inline(traj)
        state, fx = groups.on_trajectory(
            self.load(key),
            traj,
            codec.encode(traj),
            time.time(),
            self.policy,
            inline,
            self.dispatcher_id,
        )
        await self.apply(fx)
        self.store(key, state)

    async def on_result(self, key: bytes | None, value: bytes | None, meta: Any) -> None:
        result = await self._decode(value, SandboxResult, key, meta)
        if result is None:
            return
        if key != result.group_id.encode():
            await self._dead(meta, key, value, f"record key {key!r} is not the group_id")
            return
        metrics.OUTCOMES.labels(result.outcome.value).inc()
        state, fx = groups.on_result(
            self.load(key), result, time.time(), self.policy, self.score_result, self.dispatcher_id
        )
        await self.apply(fx)
        self.store(key, state)

    async def guarded(self, handler: Any, event: Any) -> None:
        """Run a handler; a failure no handler foresaw goes to the DLQ with its reason
        instead of crashing the agent (which would skip the record silently)."""
        try:
            await handler(event.key, event.value, event.message)
        except Exception as exc:
            log.exception("unexpected failure on %s", event.message.topic)
            await self._dead(
                event.message, event.key, event.value, f"dispatcher failed: {exc!r}"[:500], exc
            )

    async def on_tick(self, key: bytes | None) -> None:
        state = self.load(key) if key else None
        if state is None or key is None:
            return
        state, fx = groups.on_tick(state, time.time(), self.policy, self.dispatcher_id)
        await self.apply(fx)
        self.store(key, state, delete=fx.delete)

    async def apply(self, fx: Effects) -> None:
        """Publish the effects and wait until Kafka has them all (acks=all). The caller
        stores the new group state only afterwards: a crash in between re-runs the step on
        restart and re-sends the same messages (same ids), never loses one."""
        pending = [
            await self.send(
                self.topic(topics.SANDBOX_REQUESTS), req.request_id.encode(), codec.encode(req)
            )
            for req in fx.requests
        ]
        for scored in fx.rewards:
            value = await self.claim_check.pack(scored)
            pending.append(
                await self.send(self.topic(topics.REWARDS), scored.group_id.encode(), value)
            )
        for entry in fx.ledger:
            pending.append(
                await self.send(
                    self.topic(topics.LEDGER), entry.trajectory_id.encode(), codec.encode(entry)
                )
            )
        if pending:
            await asyncio.gather(*pending)
        now = time.time()
        for scored in fx.rewards:
            metrics.REWARDS_OUT.inc()
            metrics.LATENCY.observe(max(0.0, now - scored.trajectory.created_at))

    def due_keys(self, now: float) -> list[bytes]:
        """Keys of the local groups whose deadlines need a tick; updates the gauge."""
        due, inflight = [], 0
        for key, raw in list(self.table.items()):
            state = _STATE.decode(raw)
            inflight += state.emitted_at is None
            if groups.is_due(state, now, self.policy):
                due.append(key)
        metrics.INFLIGHT.set(inflight)
        return due

    async def _decode(
        self, value: bytes | None, expected: type[M], key: bytes | None, meta: Any
    ) -> M | None:
        try:
            return await self.claim_check.unpack(value or b"", expected)
        except SchemaError as exc:
            await self._dead(meta, key, value, f"not a valid {expected.__name__}: {exc}", exc)
            return None

    async def _dead(
        self,
        meta: Any,
        key: bytes | None,
        value: bytes | None,
        reason: str,
        error: BaseException | None = None,
    ) -> None:
        metrics.DLQ.inc()
        await publish_dead_letter(
            _Sender(self.send),
            self.topic(topics.DLQ),
            reason=reason,
            source_topic=meta.topic,
            partition=meta.partition,
            offset=meta.offset,
            key=key,
            value=value,
            consumer=f"dispatcher {self.dispatcher_id}",
            error=error,
        )


@dataclass
class _Sender:
    """Adapts the agent's transactional send to the dead-letter helper's producer protocol."""

    send: Any

    async def send_and_wait(
        self, topic: str, value: bytes | None = None, key: bytes | None = None
    ) -> object:
        await self.send(topic, key, value)
        return None
