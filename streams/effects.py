"""From the Effects of streams/groups.py to Kafka records, for one batch of the dispatcher:
requests (retries rebuilt from the member's trajectory), rewards (claim-checked), ledger
entries and dead letters. Claim-check references are resolved here (the pure state machine
keeps only references); nothing is sent here: streams/dispatcher.py sends a batch's records
together and waits once for the acks."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from schemas import codec, topics
from schemas.codec import SchemaError
from schemas.deadletter import publish_dead_letter
from schemas.rollout import ScoredTrajectory, Trajectory
from streams import metrics
from streams.groups import Effects, Emission, GroupState, Policy, request_for
from streams.members import dropped
from streams.retry import retrying

if TYPE_CHECKING:
    from streams.ports import ClaimChecks

log = logging.getLogger("rollstream.dispatcher")
Record = tuple[str, bytes | None, bytes | None]


@dataclass
class Batch:
    """What one batch of events produced so far."""

    records: list[Record] = field(default_factory=list)
    """Every record to send, in event order."""
    states: dict[bytes, GroupState | None] = field(default_factory=dict)
    """The latest state of each group the batch touched (later events read it)."""
    dirty: dict[bytes, tuple[int, GroupState | None, bool]] = field(default_factory=dict)
    """key -> (partition, state, delete) to store once the records are acked."""
    frozen: list[tuple[bytes, int, bytes | None, float | None]] = field(default_factory=list)
    """(key, partition, encoded state or None to delete, next due) per dirty key, encoded
    when the batch was staged: what settling it stores."""
    emitted: list[float] = field(default_factory=list)
    """created_at of each emitted reward (latency metric)."""
    number: int = 0
    """Its place in the dispatcher's sequence of batches."""
    acks: list[Any] | None = None
    """Delivery futures of `records`, once sent."""

    def changed(self, key: bytes, partition: int, state: GroupState | None, delete: bool) -> None:
        self.states[key] = None if delete else state
        self.dirty[key] = (partition, state, delete)


@dataclass
class Realizer:
    """Builds a batch's records from Effects."""

    claim_check: ClaimChecks
    policy: Policy
    prefix: str
    decoded: dict[bytes, Trajectory] = field(default_factory=dict)
    """Trajectories decoded on arrival, by their ref, until emitted (saves decoding them
    again; a cache only: a ref not here is decoded or fetched)."""
    decoded_bytes: int = 0
    most_decoded_bytes: int = 64 << 20

    def topic(self, spec: topics.TopicSpec) -> str:
        return spec.full_name(self.prefix)

    async def ref(self, traj: Trajectory, value: bytes, limit: int) -> bytes:
        """What the table keeps of a trajectory: its record value when small (a record
        that is a BlobRef already is small), else a claim-check reference to it."""
        ref = value if len(value) <= limit else await self.claim_check.pack(traj, inline_limit=0)
        if ref is value:  # inline: cache it (a BlobRef is resolved when needed)
            if self.decoded_bytes > self.most_decoded_bytes:
                self.decoded.clear()
                self.decoded_bytes = 0
            self.decoded[ref] = traj
            self.decoded_bytes += len(ref)
        return ref

    async def effects(self, batch: Batch, fx: Effects) -> None:
        """Append the records of `fx` (requests, retries, rewards, ledger) to the batch.
        Transient store failures are retried; the batch gets all of them or none."""
        out = await retrying(lambda: self._records(fx, batch), "resolving effects")
        batch.records.extend(out)

    async def _records(self, fx: Effects, batch: Batch) -> list[Record]:
        requests = self.topic(topics.SANDBOX_REQUESTS)
        out: list[Record] = [
            (requests, r.request_id.encode(), codec.encode(r)) for r in fx.new_requests
        ]
        for retry in fx.retries:
            traj = await self._resolve(retry.ref)
            if traj is not None:
                req = request_for(traj, retry.attempt, self.policy)
                out.append((requests, req.request_id.encode(), codec.encode(req)))
        trajs = await self._resolve_all([e.ref for e in fx.emissions])
        ledger = list(fx.ledger)
        for emission, traj in zip(fx.emissions, trajs, strict=True):
            if traj is None:
                ledger.append(self._unresolvable(emission))
                continue
            scored = emission.reward(traj)
            value = await self.claim_check.pack(scored)
            out.append((self.topic(topics.REWARDS), scored.group_id.encode(), value))
            batch.emitted.append(traj.created_at)
        for entry in ledger:
            out.append(
                (self.topic(topics.LEDGER), entry.trajectory_id.encode(), codec.encode(entry))
            )
        return out

    async def _resolve_all(self, refs: list[bytes]) -> list[Trajectory | None]:
        """The trajectories of `refs`: inline ones decoded here, BlobRefs fetched at once."""
        out: list[Trajectory | None] = []
        fetch: list[tuple[int, bytes]] = []
        for i, ref in enumerate(refs):
            cached = self.decoded.pop(ref, None)
            if cached is not None:
                out.append(cached)
                continue
            try:
                msg = codec.decode(ref)
            except SchemaError as exc:
                log.error("a member's ref is undecodable: %s", exc)
                msg = None
            out.append(msg if isinstance(msg, Trajectory) else None)
            if msg is not None and not isinstance(msg, Trajectory):
                fetch.append((i, ref))
        if fetch:
            got = await asyncio.gather(*(self._resolve(ref) for _, ref in fetch))
            for (i, _), traj in zip(fetch, got, strict=True):
                out[i] = traj
        return out

    async def _resolve(self, ref: bytes) -> Trajectory | None:
        try:
            return await self.claim_check.unpack(ref, Trajectory)
        except SchemaError as exc:
            log.error("a member's trajectory cannot be resolved: %s", exc)
            return None

    def _unresolvable(self, emission: Emission) -> Any:
        try:
            ref = codec.decode(emission.ref)
            tid, gid = ref.id, ""
        except SchemaError:
            tid, gid = "unknown", ""
        return dropped(tid, gid, "unresolvable: its trajectory's claim-check blob is gone")

    async def dead(
        self,
        batch: Batch,
        meta: Any,
        key: bytes | None,
        value: bytes | None,
        reason: str,
        error: BaseException | None = None,
    ) -> None:
        """A dead letter for the source record, sent (and acked) with the batch."""
        metrics.DLQ.inc()
        await publish_dead_letter(
            _Collect(batch),
            self.topic(topics.DLQ),
            reason=reason,
            source_topic=meta.topic,
            partition=meta.partition,
            offset=meta.offset,
            key=key,
            value=value,
            consumer="dispatcher",
            error=error,
        )


@dataclass
class _Collect:
    """The dead-letter helper's producer: the record joins the batch (acked with it)."""

    batch: Batch

    async def send_and_wait(
        self, topic: str, value: bytes | None = None, key: bytes | None = None
    ) -> object:
        self.batch.records.append((topic, key, value))
        return None


__all__ = ["Batch", "Realizer", "ScoredTrajectory"]
