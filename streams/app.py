"""The reward dispatcher: one faust app whose agents are thin loops over streams/groups.py.

Agents (all `concurrency=1`; parallelism comes from partitions and processes):

- trajectories -> group table -> sandbox requests (or an in-process score)
- sandbox.results -> group table -> rewards once the group is complete
- ticks -> group table -> retries, masks and late emissions when deadlines pass

The group table is keyed by group_id and co-partitioned with trajectories and results.

Delivery (DESIGN.md section 3): at-least-once, effectively once by id. Each step publishes
its effects and waits for Kafka's acks before it updates the group table (whose changelog
faust writes after); offsets are committed after processing. A dispatcher killed at any
moment re-runs at most the steps after its last commit on restart: they find their group
state already advanced (no effect) or re-send the very same messages, with the same ids
(requests keyed by request_id + attempt, rewards with id `{trajectory_id}:scored`), which
the sandbox workers and the learner deduplicate. Nothing is lost. (faust's exactly_once
mode was tried: it still let duplicates through under SIGKILL, so it is not used.)

The deadline timer runs outside any event, so it only *sends* a tick (with a plain
producer) for each due group; the tick agent does the work like any other event.
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
    import faust

    from schemas.claimcheck import ClaimCheck
    from services.settings import Settings

log = logging.getLogger("rollstream.dispatcher")
M = TypeVar("M", bound=Message)
_STATE = msgspec.msgpack.Decoder(GroupState)
_ENCODE = msgspec.msgpack.Encoder()


@dataclass
class Dispatcher:
    """The handlers the agents call; everything but faust plumbing lives here."""

    settings: Settings
    claim_check: ClaimCheck
    table: Any
    """faust Table: group_id bytes -> encoded GroupState."""
    send: Any
    """async (topic, key, value) -> None, inside the current event's transaction."""
    score_result: groups.ScoreResult
    score_inline: groups.ScoreInline
    dispatcher_id: str = field(default_factory=lambda: f"{socket.gethostname()}:{os.getpid()}")

    @property
    def policy(self) -> Policy:
        d = self.settings.dispatcher
        return Policy(
            request_deadline_s=d.request_deadline_s,
            max_attempts=d.max_attempts,
            group_deadline_s=d.group_deadline_s,
            tombstone_ttl_s=d.tombstone_ttl_s,
            timeout_s=d.sandbox_timeout_s,
            memory_mb=d.sandbox_memory_mb,
        )

    def topic(self, spec: topics.TopicSpec) -> str:
        return spec.full_name(self.settings.topics.prefix)

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


def build_app(settings: Settings) -> tuple[faust.App, Dispatcher]:
    """The faust app of one run (topic prefix) with its agents, table and timer."""
    import faust

    from services.blobs import from_settings
    from streams import scoring

    prefix, parts = settings.topics.prefix, settings.topics.partitions
    app_id = f"{prefix}.dispatcher"
    datadir = settings.stack.state_dir / "dispatcher" / prefix
    datadir.mkdir(parents=True, exist_ok=True)
    app = faust.App(
        app_id,
        broker=[f"kafka://{h}" for h in settings.kafka.endpoint.split(",")],
        store="memory://",
        processing_guarantee="at_least_once",
        topic_partitions=parts,
        topic_replication_factor=settings.dispatcher.changelog_replication or 1,
        producer_acks=-1,
        consumer_auto_offset_reset="earliest",
        # A dispatcher that died is noticed within seconds, so its partitions move quickly.
        broker_session_timeout=10.0,
        broker_heartbeat_interval=3.0,
        key_serializer="raw",
        value_serializer="raw",
        web_enabled=False,
        autodiscover=False,
        datadir=str(datadir),
    )

    def raw_topic(name: str, internal: bool = False) -> faust.TopicT:
        return app.topic(
            name,
            key_type=bytes,
            value_type=bytes,
            key_serializer="raw",
            value_serializer="raw",
            partitions=parts,
            internal=internal,
        )

    traj_topic = raw_topic(topics.TRAJECTORIES.full_name(prefix))
    result_topic = raw_topic(topics.SANDBOX_RESULTS.full_name(prefix))
    tick_topic = raw_topic(f"{app_id}-ticks", internal=True)
    table = app.Table("groups", default=None, key_type=bytes, value_type=bytes, partitions=parts)

    outputs: dict[str, Any] = {}

    async def send(topic: str, key: bytes | None, value: bytes | None) -> Any:
        """Publish now (not as a faust attachment); returns the delivery future."""
        if topic not in outputs:
            outputs[topic] = app.topic(topic, key_serializer="raw", value_serializer="raw")
        return await outputs[topic].send(key=key, value=value, force=True)

    d = Dispatcher(
        settings=settings,
        claim_check=from_settings(settings),
        table=table,
        send=send,
        score_result=scoring.score_result(settings),
        score_inline=scoring.score_inline(settings),
    )

    @app.agent(traj_topic, concurrency=1)
    async def trajectories(stream: Any) -> None:
        async for event in stream.events():
            await d.guarded(d.on_trajectory, event)

    @app.agent(result_topic, concurrency=1)
    async def results(stream: Any) -> None:
        async for event in stream.events():
            await d.guarded(d.on_result, event)

    @app.agent(tick_topic, concurrency=1)
    async def ticks(stream: Any) -> None:
        async for event in stream.events():
            await d.on_tick(event.key)

    ticker = _Ticker(settings, tick_topic.get_topic_name())

    async def deadlines() -> None:
        due = d.due_keys(time.time())
        if due:
            await ticker.send(due)

    async def close(sender: Any, **_: Any) -> None:
        await ticker.stop()
        await d.claim_check.aclose()

    app.timer(settings.dispatcher.tick_interval_s)(deadlines)
    app.on_before_shutdown.connect(close)  # type: ignore[arg-type]

    return app, d


class _Ticker:
    """A plain (non-transactional) producer for tick records, started on first use."""

    def __init__(self, settings: Settings, topic: str) -> None:
        self.settings, self.topic = settings, topic
        self.producer: Any = None

    async def send(self, keys: list[bytes]) -> None:
        if self.producer is None:
            from aiokafka import AIOKafkaProducer

            self.producer = AIOKafkaProducer(bootstrap_servers=self.settings.kafka.endpoint)
            await self.producer.start()
        for key in keys:
            await self.producer.send(self.topic, b"", key=key)
        await self.producer.flush()

    async def stop(self) -> None:
        if self.producer is not None:
            await self.producer.stop()
