"""The reward dispatcher's handlers: what the one agent of streams/app.py does with a batch
of events, with no faust in it.

Every event of a group (a trajectory, a sandbox result, a tick) reaches `on_events` in
partition order through one agent, so a group's state has one owner at a time and no
read-await-write interleaves. A batch is handled in four steps:

1. each event in order: decode (claim check; bad data to the DLQ with its reason), load
   the group's state (from the batch, else the table), call one pure function of
   streams/groups.py, turn its Effects into records (resolving claim-check references);
2. send every record of the batch, in order (one producer: per-partition order holds);
3. wait once for all of Kafka's acks (dead letters included);
4. only then store the changed states in the table (faust writes its changelog after).

A crash anywhere re-runs the batch on restart: the same records with the same ids, which
the sandbox workers and the learner deduplicate (see streams/app.py). Transient failures
(the blob store, a Kafka timeout) are retried with backoff (streams/retry.py); only what
can never be processed goes to the DLQ.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import msgspec

from schemas import codec, topics
from schemas.codec import SchemaError
from schemas.envelope import Message
from schemas.rollout import Trajectory
from schemas.sandbox import SandboxResult
from streams import groups, metrics
from streams.effects import Batch, Realizer
from streams.groups import GroupState, Policy
from streams.retry import retrying

if TYPE_CHECKING:
    from streams.config import DispatcherSettings
    from streams.ports import ClaimChecks

log = logging.getLogger("rollstream.dispatcher")
M = TypeVar("M", bound=Message)
_STATE = msgspec.msgpack.Decoder(GroupState)
_ENCODE = msgspec.msgpack.Encoder()
REBUILD_S = 30.0
"""How often the deadline index is rebuilt from the table (it also is after a rebalance)."""


class GroupStore(Protocol):
    """The group table: group_id -> encoded GroupState (streams/app.py adapts faust's)."""

    def get(self, key: bytes) -> bytes | None: ...

    async def put(self, key: bytes, partition: int, value: bytes | None) -> Any:
        """Set (None: delete) the key, writing the changelog to `partition`; returns an
        awaitable delivery of the changelog record (or None)."""
        ...

    def items(self) -> Iterable[tuple[bytes, bytes]]: ...


class Event(Protocol):
    """What the agent hands over (a faust event fits): key, value and the record's place."""

    key: Any
    value: Any
    message: Any


@dataclass
class Dispatcher:
    """The handlers the agent calls; everything but faust plumbing lives here."""

    section: DispatcherSettings
    prefix: str
    """The run's topic prefix."""
    claim_check: ClaimChecks
    table: GroupStore
    send: Any
    """async (topic, key, value) -> awaitable delivery (the ack)."""
    score_result: groups.ScoreResult
    score_inline: groups.ScoreInline
    send_many: Any = None
    """async (records) -> their delivery futures, for a batch's records at once
    (streams/batchsend.py); None: one `send` per record."""
    flush: Any = None
    """async () -> None: push every buffered record out now (the producer's linger only
    gathers a batch's records into few requests; None: rely on the linger). Started when
    a batch is sent, never awaited by it (the batch awaits its own acks)."""
    flushing: Any = None
    tick_topic: str = ""
    """Name of the internal tick topic (its records carry a group_id key, no value)."""
    dispatcher_id: str = field(default_factory=lambda: f"{socket.gethostname()}:{os.getpid()}")
    due: dict[bytes, float] = field(default_factory=dict)
    """Deadline index: group key -> when it next needs a tick (no decoding on the timer)."""
    rebuilt_at: float = 0.0
    staged: dict[bytes, tuple[int, GroupState | None]] = field(default_factory=dict)
    """States of batches sent but not settled yet: key -> (batch number, state)."""
    batches: int = 0
    inflight: deque[Any] = field(default_factory=deque)
    """Tasks settling the batches in flight, oldest first (streams/app.py)."""

    def __post_init__(self) -> None:
        self.policy = Policy.from_section(self.section)
        self.realizer = Realizer(self.claim_check, self.policy, self.prefix)
        self.traj_topic = topics.TRAJECTORIES.full_name(self.prefix)
        self.result_topic = topics.SANDBOX_RESULTS.full_name(self.prefix)

    def load(self, key: bytes) -> GroupState | None:
        raw = self.table.get(key)
        return None if raw is None else _STATE.decode(raw)

    async def on_events(self, events: Sequence[Event]) -> None:
        """One batch, start to end (module docstring): `settle(await stage(events))`."""
        await self.settle(await self.stage(events))

    async def stage(self, events: Sequence[Event]) -> Batch:
        """Steps 1-2: every transition in order, then every record sent (not yet acked).
        Later batches read the staged states before they are stored."""
        self.batches += 1
        batch = Batch(number=self.batches)
        for event in events:
            await self.guarded(event, batch)
        self._freeze(batch)
        if batch.records:
            await retrying(lambda: self._issue(batch), "publishing a batch")
        for key, state in batch.states.items():
            self.staged[key] = (batch.number, state)
        return batch

    async def settle(self, batch: Batch) -> None:
        """Steps 3-4: one wait for all of the batch's acks, then its states stored (and
        their changelog records acked, before the caller acks the batch's offsets)."""
        if batch.records:
            await retrying(lambda: self._deliver(batch), "publishing a batch")
        stored = [f for f in await self._commit(batch) if f is not None]
        if stored:  # the changelog is durable before the batch's offsets may move
            if self.flush is not None:
                self.flushing = asyncio.ensure_future(self.flush())
            for done in stored:
                await done
        for key in batch.states:
            if self.staged.get(key, (0, None))[0] == batch.number:
                del self.staged[key]
        now = time.time()
        for created_at in batch.emitted:
            metrics.REWARDS_OUT.inc()
            metrics.LATENCY.observe(max(0.0, now - created_at))

    async def drain(self) -> None:
        """Wait until every batch in flight is settled and acked."""
        while self.inflight:
            await self.inflight.popleft()

    async def guarded(self, event: Event, batch: Batch) -> None:
        """Handle one event; a failure no handler foresaw goes to the DLQ with its reason
        instead of crashing the agent (which would skip the record silently)."""
        meta = event.message
        try:
            if meta.topic == self.tick_topic:
                await self.on_tick(event.key, meta.partition, batch)
            elif meta.topic == self.result_topic:
                await self.on_result(event.key, event.value, meta, batch)
            else:
                await self.on_trajectory(event.key, event.value, meta, batch)
        except Exception as exc:
            log.exception("unexpected failure on %s", meta.topic)
            reason = f"dispatcher failed: {exc!r}"[:500]
            await self.realizer.dead(batch, meta, event.key, event.value, reason, exc)

    def state(self, key: bytes, batch: Batch) -> GroupState | None:
        if key in batch.states:
            return batch.states[key]
        if key in self.staged:
            return self.staged[key][1]
        return self.load(key)

    async def on_trajectory(
        self, key: bytes | None, value: bytes | None, meta: Any, b: Batch
    ) -> None:
        metrics.TRAJECTORIES_IN.inc()
        traj = await self._decode(value, Trajectory, key, meta, b)
        if traj is None or value is None:
            return
        if key is None or key != traj.group_id.encode():
            await self.realizer.dead(b, meta, key, value, f"record key {key!r} is not the group_id")
            return
        inline = None if traj.verifier.needs_sandbox else await self.score_inline(traj)
        limit = self.section.group_state_bytes // max(1, traj.group_size)
        ref = await retrying(lambda: self.realizer.ref(traj, value, limit), "storing a ref")
        now = time.time()
        state, fx = groups.on_trajectory(
            self.state(key, b), traj, ref, now, self.policy, inline, self.dispatcher_id
        )
        await self.realizer.effects(b, fx)
        b.changed(key, meta.partition, state, fx.delete)

    async def on_result(self, key: bytes | None, value: bytes | None, meta: Any, b: Batch) -> None:
        result = await self._decode(value, SandboxResult, key, meta, b)
        if result is None:
            return
        if key is None or key != result.group_id.encode():
            await self.realizer.dead(b, meta, key, value, f"record key {key!r} is not the group_id")
            return
        metrics.OUTCOMES.labels(result.outcome.value).inc()
        before = self.state(key, b)
        state, fx = groups.on_result(
            before, result, time.time(), self.policy, self.score_result, self.dispatcher_id
        )
        await self.realizer.effects(b, fx)
        if state is not None:
            b.changed(key, meta.partition, state, fx.delete)

    async def on_tick(self, key: bytes | None, partition: int, b: Batch) -> None:
        state = self.state(key, b) if key else None
        if state is None or key is None:
            self.due.pop(key or b"", None)
            return  # not ours (any more), or already gone
        state, fx = groups.on_tick(state, time.time(), self.policy, self.dispatcher_id)
        await self.realizer.effects(b, fx)
        b.changed(key, partition, state, fx.delete)

    async def _issue(self, batch: Batch) -> None:
        if batch.acks is None:
            if self.send_many is not None:
                batch.acks = await self.send_many(batch.records)
            else:
                batch.acks = [await self.send(topic, key, v) for topic, key, v in batch.records]
            if self.flush is not None:  # out now, not after the linger; not awaited here
                self.flushing = asyncio.ensure_future(self.flush())

    async def _deliver(self, batch: Batch) -> None:
        """Wait for the acks (re-sending the whole batch, same ids, after a failure)."""
        try:
            await self._issue(batch)
            for ack in batch.acks or []:
                await ack
        except Exception:
            batch.acks = None
            raise

    def _freeze(self, batch: Batch) -> None:
        """Encode the states the batch will store, now: the next batch reads (and its
        transitions change in place) the same state objects before this one settles, and
        what this batch stores must be the state as this batch left it."""
        for key, (partition, state, delete) in batch.dirty.items():
            if delete or state is None:
                batch.frozen.append((key, partition, None, None))
            else:
                due = groups.next_due(state, self.policy)
                batch.frozen.append((key, partition, _ENCODE.encode(state), due))

    async def _commit(self, batch: Batch) -> list[Any]:
        stored = []
        for key, partition, value, due in batch.frozen:
            stored.append(await self.table.put(key, partition, value))
            if value is None or due is None:
                self.due.pop(key, None)
            else:
                self.due[key] = due
        return stored

    def due_keys(self, now: float) -> list[bytes]:
        """Keys of the owned groups whose deadlines need a tick now (from the index; the
        table is decoded only when the index is rebuilt). A key just ticked waits a few
        intervals before it is ticked again, so nothing is ticked over and over."""
        if now - self.rebuilt_at > REBUILD_S:
            self.rebuild(now)
        due = [key for key, at in self.due.items() if now > at]
        later = now + max(5.0, 5 * self.section.tick_interval_s)
        for key in due:
            self.due[key] = later
        return due

    def rebuild(self, now: float) -> None:
        """The deadline index from the table (after a rebalance, and every REBUILD_S)."""
        self.due.clear()
        inflight = 0
        for key, raw in list(self.table.items()):
            try:
                state = _STATE.decode(raw)
            except msgspec.DecodeError:
                log.error("undecodable group state under %r (a tick will dead-letter it)", key)
                self.due[key] = 0.0
                continue
            inflight += state.emitted_at is None
            self.due[key] = groups.next_due(state, self.policy)
        metrics.INFLIGHT.set(inflight)
        self.rebuilt_at = now

    def forget(self) -> None:
        """Partitions moved: rebuild the deadline index at the next timer run."""
        self.rebuilt_at = 0.0

    async def _decode(
        self, value: bytes | None, expected: type[M], key: bytes | None, meta: Any, b: Batch
    ) -> M | None:
        try:
            data = value or b""
            return await retrying(lambda: self.claim_check.unpack(data, expected), "decoding")
        except SchemaError as exc:
            reason = f"not a valid {expected.__name__}: {exc}"
            await self.realizer.dead(b, meta, key, value, reason, exc)
            return None


def encode_state(state: GroupState) -> bytes:
    return _ENCODE.encode(state)


__all__ = ["Dispatcher", "Event", "GroupStore", "codec", "encode_state"]
