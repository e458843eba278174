"""The dispatcher's batch handler (streams/dispatcher.py) on fakes: one owner per group,
batched publish-then-ack-then-store, transient retries, dead letters acked with the batch,
small table values for large groups, revoked partitions dropped, no ticks while idle."""

from __future__ import annotations

import asyncio
from collections import namedtuple
from dataclasses import dataclass, field
from typing import Any

from schemas import codec, topics
from schemas.claimcheck import ClaimCheck
from schemas.rollout import ScoredTrajectory, Trajectory
from schemas.sandbox import Outcome, SandboxRequest, SandboxResult
from schemas.transport import DeadLetter
from streams.app import Rebalances, TableStore, current_events, keep_fetched_on_resume
from streams.config import DispatcherSettings
from streams.dispatcher import _STATE, Dispatcher
from streams.members import Score

from .test_streams_groups import result_for, score_result, traj

P = "unit"
TRAJ, RES, TICK = f"{P}.trajectories", f"{P}.sandbox.results", f"{P}.dispatcher-ticks"
CHANGELOG = f"{P}.dispatcher-groups-changelog"
TP = namedtuple("TP", "topic partition")  # what faust's TP has that Rebalances reads


@dataclass
class Meta:
    topic: str
    partition: int = 0
    offset: int = 0


@dataclass
class Ev:
    key: Any
    value: Any
    message: Meta


class MemStore:
    """A BlobStore in memory that fails `failures` times first (a Redis blip)."""

    kind = "redis"

    def __init__(self, failures: int = 0) -> None:
        self.blobs: dict[str, bytes] = {}
        self.failures = failures

    def _blip(self) -> None:
        if self.failures > 0:
            self.failures -= 1
            raise ConnectionError("redis blip")

    async def put(self, key: str, data: bytes, ttl_s: float | None) -> None:
        self._blip()
        self.blobs[key] = data

    async def get(self, key: str) -> bytes | None:
        self._blip()
        return self.blobs.get(key)

    async def aclose(self) -> None:
        return None


@dataclass
class FakeTable:
    """What TableStore uses of a faust Table (its data), and the changelog it is sent."""

    data: dict[bytes, bytes] = field(default_factory=dict)
    changelog: list[tuple[int, bytes, bytes | None]] = field(default_factory=list)

    async def send(self, topic: str, key: bytes, value: bytes | None, partition: int) -> Any:
        assert topic == CHANGELOG
        self.changelog.append((partition, key, value))
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        done.set_result(None)
        return done


@dataclass
class Sends:
    """The producer: records every send in order; acks after yielding to the loop."""

    log: list[tuple[str, bytes | None, bytes | None]] = field(default_factory=list)
    acked: int = 0
    fail_once: bool = False

    async def __call__(self, topic: str, key: bytes | None, value: bytes | None) -> Any:
        if self.fail_once:
            self.fail_once = False
            raise TimeoutError("kafka timeout")
        self.log.append((topic, key, value))

        async def ack() -> None:
            await asyncio.sleep(0)
            self.acked += 1

        return asyncio.ensure_future(ack())

    def on(self, name: str) -> list[bytes]:
        return [v for t, _, v in self.log if t == f"{P}.{name}" and v is not None]


def dispatcher(**section: Any) -> tuple[Dispatcher, FakeTable, Sends, MemStore]:
    table, sends, blobs = FakeTable(), Sends(), MemStore()
    d = Dispatcher(
        section=DispatcherSettings(**section),
        prefix=P,
        claim_check=ClaimCheck(blobs),
        table=TableStore(table, table.send, CHANGELOG),
        send=sends,
        score_result=score_result,
        score_inline=None,  # type: ignore[arg-type]
        tick_topic=TICK,
    )
    return d, table, sends, blobs


def t_ev(t: Trajectory, partition: int = 0) -> Ev:
    return Ev(t.group_id.encode(), codec.encode(t), Meta(TRAJ, partition))


def r_ev(r: SandboxResult, partition: int = 0) -> Ev:
    return Ev(r.group_id.encode(), codec.encode(r), Meta(RES, partition))


async def test_events_of_a_group_in_one_batch_all_count() -> None:
    """Trajectories and results of one group interleaved in one stream: every score is
    kept (the old three agents could lose one), the group is emitted once."""
    a, b = traj(index=0, size=2), traj(index=1, size=2)
    d, _, sends, _ = dispatcher()
    await d.on_events([t_ev(a)])
    await d.on_events([t_ev(b), r_ev(result_for(a, Outcome.PASSED, 1, 1)), t_ev(a)])
    await d.on_events([r_ev(result_for(b, Outcome.FAILED, 0, 1))])
    rewards = [codec.decode(v, ScoredTrajectory) for v in sends.on("rewards")]
    assert {r.trajectory.id: r.reward for r in rewards} == {a.id: 1.0, b.id: 0.0}
    requests = [codec.decode(v, SandboxRequest) for v in sends.on("sandbox.requests")]
    assert sorted((r.trajectory_id, r.attempt) for r in requests) == sorted([(a.id, 0), (b.id, 0)])


async def test_batch_sends_then_acks_then_stores() -> None:
    members = [traj(group=f"g{i}", index=0, size=1) for i in range(5)]
    d, table, sends, _ = dispatcher()
    stored_when: list[int] = []
    put = d.table.put

    async def spy(key: bytes, partition: int, value: bytes | None) -> Any:
        stored_when.append(sends.acked)
        return await put(key, partition, value)

    d.table.put = spy  # type: ignore[method-assign]
    await d.on_events([t_ev(t, partition=i % 2) for i, t in enumerate(members)])
    assert [
        codec.decode(v, SandboxRequest).trajectory_id for v in sends.on("sandbox.requests")
    ] == [t.id for t in members]
    assert stored_when == [5] * 5, "the table moved before every record was acked"
    assert sorted(p for p, _, _ in table.changelog) == [0, 0, 0, 1, 1]


async def test_transient_failures_are_retried_not_dead_lettered() -> None:
    big = traj(index=0, size=1)
    big = Trajectory(
        **{**{f: getattr(big, f) for f in big.__struct_fields__}, "completion": "x" * 300_000}
    )
    d, _, sends, blobs = dispatcher()
    value = await ClaimCheck(blobs).pack(big)  # a BlobRef: decoding needs the store
    blobs.failures = 2
    sends.fail_once = True
    await d.on_events([Ev(big.group_id.encode(), value, Meta(TRAJ))])
    assert sends.on("dlq") == []
    assert [
        codec.decode(v, SandboxRequest).trajectory_id for v in sends.on("sandbox.requests")
    ] == [big.id]


async def test_bad_records_are_dead_lettered_with_the_batch() -> None:
    d, _, sends, _ = dispatcher()
    good = traj(index=0, size=1)
    await d.on_events(
        [Ev(b"k", b"\x00garbage", Meta(TRAJ, 0, 7)), t_ev(good), Ev(b"g", b"", Meta(RES))]
    )
    keyless = traj(group="k2", index=0, size=1)
    await d.on_events([Ev(None, codec.encode(keyless), Meta(TRAJ, 1, 9))])
    letters = [codec.decode(v, DeadLetter) for v in sends.on("dlq")]
    assert [(x.source_topic, x.source_offset) for x in letters] == [(TRAJ, 7), (RES, 0), (TRAJ, 9)]
    assert sends.acked == len(sends.log), "on_events returned before the dead letters were acked"


async def test_group_of_64_with_100_kb_trajectories() -> None:
    """The table keeps claim-check references, not whole trajectories: its value stays far
    below faust's ~1 MB record limit, and the rewards still carry the whole trajectories."""
    members = [traj(index=i, size=64) for i in range(64)]
    members = [
        Trajectory(
            **{
                **{f: getattr(t, f) for f in t.__struct_fields__},
                "completion": t.completion + "#" * 100_000,
            }
        )
        for t in members
    ]
    d, table, sends, _ = dispatcher()
    await d.on_events([t_ev(t) for t in members])
    assert max(len(v) for _, _, v in table.changelog if v) < 64 * 1024
    await d.on_events([r_ev(result_for(t, Outcome.PASSED, 1, 1)) for t in members])
    assert max(len(v) for _, _, v in table.changelog if v) < 64 * 1024
    rewards = [await d.claim_check.unpack(v, ScoredTrajectory) for v in sends.on("rewards")]
    assert sorted(r.trajectory.id for r in rewards) == sorted(t.id for t in members)
    assert all(len(r.trajectory.completion) > 100_000 for r in rewards)


async def test_moved_partitions_are_dropped_and_never_ticked() -> None:
    d, table, sends, _ = dispatcher(request_deadline_s=1.0)
    mine, theirs = traj(group="mine", size=1), traj(group="theirs", size=1)
    await d.on_events([t_ev(mine, 0), t_ev(theirs, 1)])
    assert isinstance(d.table, TableStore)
    on = Rebalances(d, d.table, TRAJ)
    await on.revoked({TP(TRAJ, 0), TP(TRAJ, 1)})  # eager: every partition is revoked
    assert set(table.data) == {b"mine", b"theirs"}, "nothing is dropped before the assignment"
    await on.assigned({TP(TRAJ, 0), TP(TICK, 0), TP(TICK, 1)})  # partition 1 moved away
    assert set(table.data) == {b"mine"}
    far = mine.created_at + 1000
    assert d.due_keys(far) == [b"mine"]
    await d.on_events([Ev(b"theirs", b"", Meta(TICK, 1))])  # a tick for a group not ours
    assert len(sends.on("sandbox.requests")) == 2


async def test_a_retained_partition_keeps_its_groups_across_rebalances() -> None:
    """faust re-reads only the tail of a retained partition's changelog, so a group it
    wrote before the last rebalance must stay in memory (dropped, its later members would
    form a second, smaller group, emitted at its deadline with other advantages)."""
    d, _, sends, _ = dispatcher()
    a, b = traj(index=0, group="kept", size=2), traj(index=1, group="kept", size=2)
    await d.on_events([t_ev(a, 0)])
    assert isinstance(d.table, TableStore)
    on = Rebalances(d, d.table, TRAJ)
    for _ in range(2):  # two rebalances in a row, partition 0 retained by both
        await on.revoked({TP(TRAJ, 0), TP(TRAJ, 1)})
        await on.assigned({TP(TRAJ, 0)})
    passed = [r_ev(result_for(t, Outcome.PASSED, 1, 1)) for t in (a, b)]
    await d.on_events([t_ev(b, 0), *passed])
    rewards = [await d.claim_check.unpack(v, ScoredTrajectory) for v in sends.on("rewards")]
    assert sorted(r.trajectory.id for r in rewards) == sorted([a.id, b.id])
    assert {r.group_size_scored for r in rewards} == {2}


async def test_no_ticks_while_idle_and_the_tick_path_is_guarded() -> None:
    d, table, sends, _ = dispatcher()
    a = traj(index=0, size=1)
    await d.on_events([t_ev(a), r_ev(result_for(a, Outcome.PASSED, 1, 1))])
    now = a.created_at
    for step in range(1, 30):  # every tick interval for half a minute: nothing is due
        assert d.due_keys(now + step) == []
    table.data[b"broken"] = b"\xc1"  # a state nobody can decode
    await d.on_events([Ev(b"broken", b"", Meta(TICK, 0, 3))])
    letters = [codec.decode(v, DeadLetter) for v in sends.on("dlq")]
    assert [(x.source_topic, x.source_offset) for x in letters] == [(TICK, 3)]
    assert topics.DLQ.full_name(P) == f"{P}.dlq"


async def test_a_staged_batch_stores_its_own_states_not_a_later_batchs() -> None:
    """Batches overlap: batch 2 is staged (reading batch 1's staged state) while batch 1
    still waits for its acks. What batch 1 stores must be the state as batch 1 left it:
    were it the shared object that batch 2 went on to change, a group would be stored as
    emitted before its rewards were acked, and a crash then would lose them (found by
    SIGKILLing a dispatcher under load: groups stored emitted with no rewards on the topic)."""
    a, b = traj(index=0, size=2, sandbox=False), traj(index=1, size=2, sandbox=False)
    d, table, sends, _ = dispatcher()

    async def inline(_: Trajectory) -> Score:
        return Score(outcome=Outcome.PASSED, reward=1.0, passed=1, total=1)

    d.score_inline = inline  # type: ignore[assignment]
    first = await d.stage([t_ev(a)])
    second = await d.stage([t_ev(b)])  # the group is complete: emitted in batch 2
    assert sends.on("rewards"), "batch 2 emitted the group"
    await d.settle(first)
    state = _STATE.decode(table.data[a.group_id.encode()])
    assert state.emitted_at is None, "batch 1 stored batch 2's emission before its acks"
    assert len(state.members) == 1
    await d.settle(second)
    assert _STATE.decode(table.data[a.group_id.encode()]).emitted_at is not None


@dataclass
class _Msg:
    generation_id: int


@dataclass
class _Ev:
    message: _Msg


class _Flow:
    def __init__(self, active: bool) -> None:
        self.active = active

    def is_active(self) -> bool:
        return self.active


class _App:
    def __init__(self, active: bool, generation: int) -> None:
        self.flow_control, self.consumer_generation_id = _Flow(active), generation


class _Queue:
    """What faust's ThrowableQueue has that the workaround touches."""

    def __init__(self, events: list[_Ev]) -> None:
        self._queue, self.cleared = list(events), 0

    def clear(self) -> None:
        self.cleared += 1
        self._queue.clear()


def test_current_events_keeps_only_this_generation() -> None:
    queued = [_Ev(_Msg(3)), _Ev(_Msg(4)), object(), _Ev(_Msg(4))]
    assert current_events(queued, 4) == [queued[1], queued[3]]
    assert current_events(queued, 5) == []


def test_the_resume_clear_keeps_events_of_the_current_assignment() -> None:
    """faust clears agent queues on every resume, also after the new assignment's first
    events were fetched: those must survive (untracked, they were lost for good)."""
    app = _App(active=True, generation=7)
    stale, fresh = _Ev(_Msg(6)), [_Ev(_Msg(7)), _Ev(_Msg(7))]
    queue = _Queue([stale, *fresh])
    keep_fetched_on_resume(app, queue)
    queue.clear()
    assert queue._queue == fresh and queue.cleared == 0
    app.flow_control.active = False  # suspended: the revocation's clear is faust's own
    queue.clear()
    assert queue._queue == [] and queue.cleared == 1
