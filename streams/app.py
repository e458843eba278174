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

The deadline timer runs outside any event, so it only *sends* a tick (with the plain
producer of `Wiring.ticks`) for each due group; the tick agent does the work like any other
event.

The handlers live in streams/dispatcher.py; the broker, prefix, state directory, claim
check and tick producer come in as a `ports.Wiring` (services/dispatcher_wiring.py).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from schemas import topics
from streams import scoring
from streams.dispatcher import Dispatcher

if TYPE_CHECKING:
    import faust

    from sandbox_workers.config import RewardsSettings
    from streams.config import DispatcherSettings
    from streams.ports import Wiring


def build_app(
    wiring: Wiring, section: DispatcherSettings, rewards: RewardsSettings
) -> tuple[faust.App, Dispatcher]:
    """The faust app of one run (topic prefix) with its agents, table and timer."""
    app = make_app(wiring)
    parts, prefix = wiring.partitions, wiring.prefix
    traj_topic = _raw_topic(app, topics.TRAJECTORIES.full_name(prefix), parts)
    result_topic = _raw_topic(app, topics.SANDBOX_RESULTS.full_name(prefix), parts)
    tick_topic = _raw_topic(app, f"{app.conf.id}-ticks", parts, internal=True)
    table = app.Table("groups", default=None, key_type=bytes, value_type=bytes, partitions=parts)
    d = Dispatcher(
        section=section,
        prefix=prefix,
        claim_check=wiring.claim_check,
        table=table,
        send=_sender(app),
        score_result=scoring.score_result(rewards),
        score_inline=scoring.score_inline(rewards),
    )
    _agents(app, d, traj_topic, result_topic, tick_topic)
    _deadlines(app, d, wiring, tick_topic.get_topic_name(), section.tick_interval_s)
    return app, d


def make_app(wiring: Wiring) -> faust.App:
    """The faust app (no agents yet): app id = the DISPATCHER consumer group of the run."""
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


def _raw_topic(app: faust.App, name: str, parts: int, internal: bool = False) -> faust.TopicT:
    return app.topic(
        name,
        key_type=bytes,
        value_type=bytes,
        key_serializer="raw",
        value_serializer="raw",
        partitions=parts,
        internal=internal,
    )


def _sender(app: faust.App) -> Any:
    """async (topic, key, value) -> delivery future: publish now (not as a faust
    attachment), through the app's producer."""
    outputs: dict[str, Any] = {}

    async def send(topic: str, key: bytes | None, value: bytes | None) -> Any:
        if topic not in outputs:
            outputs[topic] = app.topic(topic, key_serializer="raw", value_serializer="raw")
        return await outputs[topic].send(key=key, value=value, force=True)

    return send


def _agents(app: faust.App, d: Dispatcher, traj_t: Any, result_t: Any, tick_t: Any) -> None:
    """The three agents: thin loops handing each event to the dispatcher."""

    async def trajectories(stream: Any) -> None:
        async for event in stream.events():
            await d.guarded(d.on_trajectory, event)

    async def results(stream: Any) -> None:
        async for event in stream.events():
            await d.guarded(d.on_result, event)

    async def ticks(stream: Any) -> None:
        async for event in stream.events():
            await d.on_tick(event.key)

    app.agent(traj_t, concurrency=1)(trajectories)
    app.agent(result_t, concurrency=1)(results)
    app.agent(tick_t, concurrency=1)(ticks)


def _deadlines(app: faust.App, d: Dispatcher, wiring: Wiring, topic: str, every_s: float) -> None:
    """The timer that sends a tick per due group, and the shutdown hook."""

    async def deadlines() -> None:
        due = d.due_keys(time.time())
        if due:
            await wiring.ticks.send(topic, due)

    async def close(sender: Any, **_: Any) -> None:
        await wiring.ticks.close()
        await wiring.claim_check.aclose()

    app.timer(every_s)(deadlines)
    app.on_before_shutdown.connect(close)  # type: ignore[arg-type]
