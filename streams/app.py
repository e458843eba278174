"""The reward dispatcher: one faust app with ONE agent over the three co-partitioned,
group-keyed topics (trajectories, sandbox.results and the internal ticks topic), so every
event of a group passes one agent in partition order: a group's state has one owner at a
time (faust's agent concurrency stays 1: faust-streaming issue #606). No forwarding hop:
the three topics are subscribed together, and faust's assignor gives partition p of all
three, and of the group table's changelog, to the same worker.

Delivery (DESIGN.md section 3): at-least-once, effectively once by id. The agent takes
events in adaptive batches (`batch_max`, streams/intake.py: no event is held while the
agent waits for the next, so a rebalance never waits on an unstaged batch);
streams/dispatcher.py runs each batch's
transitions in order, sends all their records, waits once for Kafka's acks, and only then
updates the group table (its changelog is written after); offsets are acked after the
batch. A dispatcher killed at any moment re-runs at most the batches after its last
commit on restart: they find their group state already advanced (no effect) or re-send
the very same records, with the same ids (requests keyed by request_id + attempt, rewards
`{trajectory_id}:scored`, dispatcher fates `{trajectory_id}:dispatcher-fate`), which the
sandbox workers, the learner and the audit deduplicate. (faust's exactly_once mode let
duplicates through under SIGKILL, so it is not used.)

The deadline timer runs outside any event, so it only *sends* a tick (with the plain
producer of `Wiring.ticks`) for each due owned group; the agent handles it like any other
event. After a rebalance the state of partitions that moved away is dropped from memory
(faust's memory store keeps locally written keys otherwise), so no stale group is ticked
or comes back; retained partitions keep theirs (class Rebalances); partitions assigned
again are recovered from the changelog. faust clears the agent's queue when a rebalance's
recovery resumes the streams, after the new assignment's first events were fetched; those
are kept (`keep_fetched_on_resume`), or their offsets would never be acked and the commit
would stop below them for good. The fetcher hands a record to the agent's queue in place
when that does not suspend (streams/handoff.py: faust's per-record `wait_first` made four
tasks per record), and a batch's records go out as Kafka record batches, one delivery
future per partition's batch (streams/batchsend.py), partitioned as aiokafka's `send` would.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from schemas import topics
from streams import scoring
from streams.batchsend import BatchSender
from streams.dispatcher import Dispatcher
from streams.handoff import fast_handoff
from streams.intake import HOLD_S, Intake

if TYPE_CHECKING:
    import faust

    from sandbox_workers.config import RewardsSettings
    from streams.config import DispatcherSettings
    from streams.ports import Wiring


def build_app(
    wiring: Wiring, section: DispatcherSettings, rewards: RewardsSettings
) -> tuple[faust.App, Dispatcher]:
    """The faust app of one run (topic prefix) with its agent, table and timer."""
    app = make_app(wiring, section.stream_buffer)
    parts, prefix = wiring.partitions, wiring.prefix
    tick_name = f"{app.conf.id}-ticks"
    names = (topics.TRAJECTORIES.full_name(prefix), topics.SANDBOX_RESULTS.full_name(prefix))
    # internal: faust creates the ticks topic (existing topics are left as they are).
    events = _raw_topic(app, (*names, tick_name), parts, internal=True)
    table = app.Table("groups", default=None, key_type=bytes, value_type=bytes, partitions=parts)
    send = _sender(app)
    store = TableStore(table, send, table.changelog_topic.get_topic_name())
    d = Dispatcher(
        section=section,
        prefix=prefix,
        claim_check=wiring.claim_check,
        table=store,
        send=send,
        send_many=BatchSender(lambda: app.producer._ensure_producer()),  # type: ignore[attr-defined]
        flush=lambda: app.producer.flush(),
        score_result=scoring.score_result(rewards),
        score_inline=scoring.score_inline(rewards),
        tick_topic=tick_name,
    )

    app.agent(events, name="groups", concurrency=1)(
        _batches(d, section.batch_max, section.batches_in_flight, section.batch_gather_s)
    )
    _rebalances(app, d, store, names[0])
    _deadlines(app, d, wiring, tick_name, section.tick_interval_s)
    return app, d


def _batches(d: Dispatcher, most: int, depth: int, gather_s: float) -> Any:
    """The agent: streams/intake.py over the stream with manual acks (adaptive batches,
    up to `depth` in flight, settled in order; no event held while the agent waits)."""

    async def groups(stream: Any) -> None:
        manual = stream.noack()
        keep_fetched_on_resume(stream.app, manual.channel.queue)
        fast_handoff(stream.app.consumer)
        intake = Intake(d, manual, most=most, depth=depth, gather_s=gather_s, hold_s=HOLD_S)
        await intake.run(manual.events(), manual.channel.queue)
        await d.drain()

    return groups


def current_events(queued: Iterable[Any], generation: int) -> list[Any]:
    """The queued events fetched in consumer generation `generation` (all others are
    events of an earlier assignment, which faust skips anyway)."""
    return [
        e for e in queued if getattr(getattr(e, "message", None), "generation_id", -1) == generation
    ]


def keep_fetched_on_resume(app: Any, queue: Any) -> None:
    """Make faust's clear-on-resume of the agent's queue keep the current assignment's
    events (faust-streaming 0.15.3).

    Every `flow_control.resume()` clears the agent queues, including the resume that ends a
    rebalance's recovery (tables/recovery.py `_resume_streams`), which comes after stream
    partitions were resumed and the fetcher had already queued the new assignment's first
    events. Those events were never tracked, so nothing acks them: the events after them
    are processed and acked, the commit stops below the gap for good, and the cleared
    events are lost until the group's next restart (the scale-out test saw about 30 per
    partition go missing this way). On a resume (flow active) only events of an earlier
    generation are dropped, and blocked putters are left alone; the clear at revocation
    (flow suspended; positions are reset at the next assignment) is faust's own."""
    clear = queue.clear

    def clear_stale() -> None:
        if not app.flow_control.is_active():
            clear()
            return
        kept = current_events(queue._queue, app.consumer_generation_id)
        queue._queue.clear()
        queue._queue.extend(kept)

    queue.clear = clear_stale


def make_app(wiring: Wiring, stream_buffer: int) -> faust.App:
    """The faust app (no agents yet): app id = the DISPATCHER consumer group of the run;
    `stream_buffer`: dispatcher.stream_buffer."""
    import faust

    datadir = wiring.state_dir / "dispatcher" / wiring.prefix
    datadir.mkdir(parents=True, exist_ok=True)
    return faust.App(
        topics.DISPATCHER.full_id(wiring.prefix),
        broker=[f"kafka://{h}" for h in wiring.brokers],
        store="memory://",
        processing_guarantee="at_least_once",
        topic_partitions=wiring.partitions,
        topic_replication_factor=wiring.replication,
        producer_acks=-1,
        # A batch's records gather into few produce requests; the dispatcher flushes
        # each batch at once, so the linger adds no latency to it.
        producer_linger_ms=20,
        stream_buffer_maxsize=stream_buffer,
        consumer_auto_offset_reset="earliest",
        # No standby copies of other workers' partitions in this one's table: it holds
        # (and ticks) only the groups it owns; a moved partition recovers from the changelog.
        table_standby_replicas=0,
        # A dispatcher that died is noticed within seconds, so its partitions move quickly.
        broker_session_timeout=10.0,
        broker_heartbeat_interval=3.0,
        key_serializer="raw",
        value_serializer="raw",
        web_enabled=False,
        autodiscover=False,
        datadir=str(datadir),
    )


class TableStore:
    """streams.dispatcher.GroupStore on a faust Table: writes name their changelog
    partition (the event's, since a batch holds events of several partitions) and are
    remembered by partition, so a revoked partition's keys can be dropped.

    The changelog record goes straight through the app's producer (`send`), not through
    faust's `send_changelog`: that queues every record in faust's producer buffer, a
    task of its own and a `Topic.send_soon` per record (a memory store keeps no persisted
    offsets, so its callback does nothing). Same topic, partition, key and value."""

    def __init__(self, table: Any, send: Any, changelog: str) -> None:
        self.table, self.send, self.changelog = table, send, changelog
        self.partition_of: dict[bytes, int] = {}

    def get(self, key: bytes) -> bytes | None:
        value = self.table.data.get(key)
        return value if isinstance(value, bytes) else None

    async def put(self, key: bytes, partition: int, value: bytes | None) -> Any:
        """Set (None: delete) the key; returns the changelog record's delivery future."""
        if value is None:
            if self.table.data.pop(key, None) is None:
                return None
            self.partition_of.pop(key, None)
        else:
            self.table.data[key] = value
            self.partition_of[key] = partition
        return await self.send(self.changelog, key, value, partition)

    def items(self) -> Iterable[tuple[bytes, bytes]]:
        return list(self.table.data.items())

    def keep(self, partitions: set[int]) -> int:
        """Forget (in memory only) the keys this process wrote outside `partitions` (the
        ones it owns now); returns how many. Keys of a retained partition stay: faust
        re-reads only the tail of a retained partition's changelog after a rebalance."""
        gone = [k for k, p in self.partition_of.items() if p not in partitions]
        for key in gone:
            self.table.data.pop(key, None)
            del self.partition_of[key]
        return len(gone)


def _raw_topic(
    app: faust.App, names: tuple[str, ...], parts: int, internal: bool = False
) -> faust.TopicT:
    return app.topic(
        *names,
        key_type=bytes,
        value_type=bytes,
        key_serializer="raw",
        value_serializer="raw",
        partitions=parts,
        internal=internal,
    )


def _sender(app: faust.App) -> Any:
    """async (topic, key, value[, partition]) -> delivery future: publish now, straight
    through the app's producer (not as a faust attachment; none of faust's per-topic
    machinery). No partition: the producer's partitioner picks it from the key."""

    async def send(
        topic: str, key: bytes | None, value: bytes | None, partition: int | None = None
    ) -> Any:
        return await app.producer.send(topic, key, value, partition, None, None)

    return send


class Rebalances:
    """What a rebalance does to the dispatcher's state (faust-free; `_rebalances` wires it).

    aiokafka rebalances eagerly: every rebalance first revokes *all* of a worker's
    partitions, then assigns the new set, and faust keeps a retained partition's table
    rows, re-reading only the changelog written since its last recovery. So nothing is
    dropped on revocation (that lost every group a retained partition had not written
    since: redelivered members then formed a second, smaller group): once the new
    assignment is known, only the keys of partitions that moved away are forgotten."""

    def __init__(self, d: Dispatcher, store: TableStore, traj_topic: str) -> None:
        self.d, self.store, self.traj_topic = d, store, traj_topic

    async def revoked(self, revoked: Iterable[Any]) -> None:
        await self.d.drain()  # the batch in flight stores its states first
        self.d.forget()

    async def assigned(self, assigned: Iterable[Any]) -> None:
        self.store.keep({tp.partition for tp in assigned if tp.topic == self.traj_topic})
        self.d.forget()


def _rebalances(app: faust.App, d: Dispatcher, store: TableStore, traj_topic: str) -> None:
    """Forget the state of partitions that moved away; rebuild the deadline index."""
    on = Rebalances(d, store, traj_topic)

    async def revoked(sender: Any, revoked: set[Any], **_: Any) -> None:
        await on.revoked(revoked)

    async def assigned(sender: Any, assigned: set[Any], **_: Any) -> None:
        await on.assigned(assigned)

    app.on_partitions_revoked.connect(revoked)  # type: ignore[arg-type]
    app.on_partitions_assigned.connect(assigned)  # type: ignore[arg-type]


def _deadlines(app: faust.App, d: Dispatcher, wiring: Wiring, topic: str, every_s: float) -> None:
    """The timer that sends a tick per due owned group, and the shutdown hook."""

    async def deadlines() -> None:
        due = d.due_keys(time.time())
        if due:
            await wiring.ticks.send(topic, due)

    async def close(sender: Any, **_: Any) -> None:
        await d.drain()
        await wiring.ticks.close()
        await wiring.claim_check.aclose()

    app.timer(every_s)(deadlines)
    app.on_before_shutdown.connect(close)  # type: ignore[arg-type]
