"""The rollout generator service (`rollstream generator`, DESIGN.md section 7).

Consumes `tasks` in the consumer group `{prefix}.generators`; per task samples a group of
`group_size` completions with the current policy (temperature `learner.temperature`,
`generator.top_p`, `generator.max_new_tokens`), records per-token behaviour logprobs and
the policy version of every token, and publishes one Trajectory per completion on
`trajectories` (key group_id = the task message's id). Sampling runs in a worker, out
of the consumer's poll loop (services/rollout/intake.py). The task's offset is committed
after every trajectory of its group is acknowledged (at-least-once: a crash re-samples
the task). A member's id is derived from its group and index (`member_id`), so a
re-sampled group re-uses its ids: the dispatcher takes the second copy as a redelivery
and a group never has more than `group_size` members.

Weights: `WeightsWatcher` fetches and verifies announced weights; with
`generator.inflight_updates` they are loaded between decoding steps of a running batch
(as PipelineRL), else between sequences; each token records the version whose logits it
was drawn from. Pacing: before a group, wait while it would put more than (max_lag + 1) x
batch trajectories beyond what the learner has settled, one count on both sides
(services/rollout/pacing.py, services/rollout/progress.py). Episodes: the generator does
not know single- from multi-turn or tool-calling tasks; services/rollout/episodes.py picks
the environment that runs a task, the generator is its `Sampler`.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

import msgspec

from schemas import topics
from schemas.codec import SchemaError
from schemas.rollout import Task, Trajectory
from services import kafka
from services.rollout import episode, pacing, stops
from services.rollout import metrics as m
from services.rollout.episodes import Episodes, import_environments
from services.rollout.generator_state import Parts, Summary, member_id
from services.rollout.intake import Intake
from services.rollout.progress import ProgressBoard
from services.rollout.weights_watch import WeightsWatcher

if TYPE_CHECKING:
    from aiokafka import AIOKafkaConsumer

    from services.settings import Settings

log = logging.getLogger("rollstream.generator")


class Generator:
    def __init__(
        self, settings: Settings, *, max_groups: int | None = None, idle_exit_s: float | None = None
    ) -> None:
        self.settings = settings
        self.cfg = settings.generator
        self.id = self.cfg.generator_id or f"{socket.gethostname()}:{os.getpid()}"
        self.max_groups = max_groups
        self.idle_exit_s = idle_exit_s
        self.summary = Summary()
        self.version = -1
        self.produced = self.in_flight = 0
        """Trajectories of whole acknowledged groups published; of the group sampling."""
        self.mean_tokens = pacing.RunningMean()
        self.lock = asyncio.Lock()
        """Held while sampling and while swapping weights: a swap never splits a sequence."""
        self._stop = asyncio.Event()
        self.trajectories_topic = kafka.topic(settings, topics.TRAJECTORIES)
        self._parts: Parts | None = None
        self._closing: list[Callable[[], Awaitable[object]]] = []
        """What start() started, to stop in reverse order."""
        self.watcher: WeightsWatcher | None = None
        self.dead: kafka.DeadLetters | None = None
        self.episodes: Episodes | None = None
        self.board: ProgressBoard | None = None
        self.intake: Intake | None = None

    def request_stop(self) -> None:
        self._stop.set()

    # -- life cycle ----------------------------------------------------------------------

    async def start(self) -> None:
        import torch

        from learner.spec import build_policy, policy_spec
        from services import blobs
        from services.models import resolved
        from services.rollout.textcodec import for_policy

        torch.set_num_threads(self.cfg.torch_threads)
        section = await asyncio.to_thread(resolved, self.settings)
        policy = build_policy(policy_spec(section))
        policy.train(False)
        codec = for_policy(policy)
        rng = torch.Generator()
        rng.manual_seed(self.cfg.seed if self.cfg.seed is not None else time.time_ns())
        claim = blobs.from_settings(self.settings)
        self._closing.append(claim.aclose)
        producer = kafka.producer(self.settings, f"rollstream-generator-{self.id}")
        await producer.start()
        self._closing.append(producer.stop)
        self.dead = kafka.DeadLetters(
            self.settings, producer, f"generator {self.id}", m.DEAD_LETTERS.inc
        )
        import_environments(self.cfg.environments)
        self.episodes = Episodes(
            episode.Context(self.settings, self, codec, self.id, producer, claim)
        )
        shapes = {k: tuple(v.shape) for k, v in policy.weights().items()}
        self.watcher = WeightsWatcher(self.settings, shapes, self.dead)
        await self.watcher.start()
        self.board = ProgressBoard(self.settings, self.id, self.dead)
        await self.board.start()
        self._closing.append(self.board.stop)
        consumer = self._task_consumer()
        self.intake = Intake(consumer, self._handle)
        consumer.subscribe(
            [kafka.topic(self.settings, topics.TASKS)], listener=self.intake.listener()
        )
        await consumer.start()
        self._closing.append(consumer.stop)
        self._parts = Parts(policy, codec, rng, claim, producer, consumer)

    @property
    def parts(self) -> Parts:
        if self._parts is None:
            raise RuntimeError(f"generator {self.id} is not started")
        return self._parts

    def _task_consumer(self) -> AIOKafkaConsumer:
        return kafka.consumer(
            self.settings,
            f"rollstream-generator-{self.id}",
            group_id=kafka.group(self.settings, topics.GENERATORS),
            max_poll_records=1,
        )

    async def close(self) -> None:
        if self.episodes is not None:
            await self.episodes.close()
        if self.watcher is not None:
            await self.watcher.stop()
        while self._closing:
            await self._closing.pop()()

    async def run(self) -> Summary:
        """Start, then generate until stopped or a limit is reached."""
        try:
            await self.start()
            if await self._first_weights():
                await self._loop()
        finally:
            await self.close()
            if self.watcher is not None:
                self.summary.weight_failures = self.watcher.failures
            if self.dead is not None:
                self.summary.dead_letters = self.dead.count
        return self.summary

    async def _first_weights(self) -> bool:
        assert self.watcher is not None
        limit = self.cfg.first_weights_timeout_s
        started = last_note = time.monotonic()
        while not self._stop.is_set():
            if await self.swap():
                return True
            now = time.monotonic()
            if limit and now - started > limit:
                raise TimeoutError(f"no usable weights announced within {limit} s")
            if now - last_note > 15:
                log.info("waiting for the learner's first weights announcement")
                last_note = now
            self.watcher.changed.clear()
            await self._wait(self.watcher.changed, 0.5)
        return False

    # -- main loop -----------------------------------------------------------------------

    async def _loop(self) -> None:
        assert self.intake is not None
        intake, last_task = self.intake, time.monotonic()
        try:
            while not self._stop.is_set():
                done = self.max_groups is not None and self.summary.groups >= self.max_groups
                if done and not intake.busy:
                    return
                if intake.busy or await intake.poll():
                    last_task = time.monotonic()
                    if intake.busy:
                        await intake.poll()  # keeps the member alive while the worker runs
                    continue
                idle = self.idle_exit_s
                if idle is not None and time.monotonic() - last_task > idle:
                    return
                async with self.lock:
                    await self.swap()
        finally:
            await intake.drain()

    async def _handle(self, rec: kafka.KafkaRecord) -> None:
        """The worker of one task: decode, pace, sample, publish, commit."""
        from aiokafka import TopicPartition
        from aiokafka.errors import CommitFailedError

        task = await self._decode(rec)
        if task is not None:
            group = await self.rollout(task, group_id=task.id)
            if not group:
                return  # stopped before sampling: the task stays uncommitted for the next one
            await self.publish(group)
        tp = TopicPartition(rec.topic, rec.partition)
        try:
            await self.parts.consumer.commit({tp: rec.offset + 1})
        except CommitFailedError:  # redelivered to the partition's new owner (stable ids)
            log.warning("commit of %s@%d refused after a rebalance; redelivered", tp, rec.offset)

    async def _decode(self, rec: kafka.KafkaRecord) -> Task | None:
        assert self.dead is not None
        try:
            if rec.value is None:
                raise SchemaError("bytes", "$", "empty record (tombstone) on tasks")
            task: Task = await self.parts.claim.unpack(rec.value, Task)
        except SchemaError as exc:
            await self.dead.send(rec, f"undecodable Task: {exc}", exc)
            return None
        room = self.parts.policy.max_seq_len - len(self.parts.codec.prompt_ids(task))
        if room < 2:
            why = f"prompt leaves {room} tokens under max_seq_len {self.parts.policy.max_seq_len}"
            await self.dead.send(rec, f"task {task.task_id} cannot be sampled: {why}")
            return None
        return task

    # -- sampling ------------------------------------------------------------------------

    async def rollout(self, task: Task, group_id: str) -> list[Trajectory]:
        """Sample the task's group (after pacing) with the environment that runs it."""
        await self.pace(task.group_size)
        if self._stop.is_set():
            return []
        assert self.episodes is not None and self.intake is not None
        self.intake.sampling, self.in_flight = True, task.group_size
        try:
            return await self.episodes.for_task(task).group(task, group_id)
        finally:
            self.in_flight = 0

    # -- the episodes' Sampler -----------------------------------------------------------

    @property
    def max_seq_len(self) -> int:
        return int(self.parts.policy.max_seq_len)

    async def turns(
        self, context: list[int], n: int, stop: Sequence[str] = ()
    ) -> list[episode.Turn]:
        """`n` completions of `context`, after swapping in newer verified weights (under
        `lock`), each cut after its first stop string; with inflight_updates, newer weights
        are also adopted between decoding steps, and each token records its version."""
        async with self.lock:
            await self.swap()
            version = self.version
            completions = await asyncio.to_thread(self.sample, context, n, stop)
        return [self.turn(c, version) for c in completions]

    def sample(self, prompt_ids: list[int], n: int, stop: Sequence[str] = ()) -> list[Any]:
        """Completions of one prompt with the current weights (call under `lock`), cut
        after their first stop string (services/rollout/stops.py)."""
        policy = self.parts.policy
        between = self._between_steps if self.cfg.inflight_updates else None
        drawn = policy.sample(
            prompt_ids, n, max_new_tokens=self.cfg.max_new_tokens,
            temperature=self.settings.learner.temperature, top_p=self.cfg.top_p,
            generator=self.parts.rng, between_steps=between, version=self.version,
            **stops.sampler_stop(policy, stop),
        )  # fmt: skip
        return [stops.truncate(c, self.parts.codec.text, stop) for c in drawn]

    def _between_steps(self) -> int | None:
        """In the sampling thread, between two decoding steps (under `lock`): load newer
        verified weights in place; their version, or None."""
        assert self.watcher is not None
        ready = self.watcher.take()
        if ready is None:
            return None
        self._load(ready)
        self.summary.inflight_swaps += 1
        return self.version

    def turn(self, completion: Any, version: int) -> episode.Turn:
        versions = list(completion.versions) or [version] * len(completion.tokens)
        return episode.Turn(
            tokens=list(completion.tokens),
            logprobs=list(completion.logprobs),
            version=versions[0] if versions else version,
            text=self.parts.codec.text(completion.tokens),
            finish_reason=completion.finish_reason,
            versions=versions,
        )

    async def swap(self) -> bool:
        """Load verified newer weights if there are any (call under `lock`, or before
        sampling starts). True when weights were loaded."""
        assert self.watcher is not None
        ready = self.watcher.take()
        if ready is None:
            return False
        await asyncio.to_thread(self._load, ready)
        return True

    def _load(self, ready: Any) -> None:
        self.parts.policy.load_weights(ready.state)
        old, self.version = self.version, ready.update.version
        m.VERSION.set(self.version)
        if old >= 0:
            self.summary.swaps += 1
            m.SWAPS.inc()
        log.info("generator %s: policy v%d -> v%d", self.id, old, self.version)

    # -- pacing and publication ----------------------------------------------------------

    async def pace(self, group_size: int) -> None:
        """Wait until a group of `group_size` fits in the staleness window."""
        if not self.cfg.pacing:
            return
        assert self.board is not None
        ls, started, board = self.settings.learner, time.monotonic(), self.board
        while not self._stop.is_set():
            batch = pacing.batch_samples(
                ls.batch_tokens, self.mean_tokens.value, self.cfg.batch_samples
            )
            window = pacing.window(ls.max_lag, batch)
            now = pacing.outstanding(self.produced, 0, board.others_produced(), board.consumed)
            m.OUTSTANDING.set(now)
            if pacing.may_start(group_size, now, window):
                self.summary.max_outstanding = max(self.summary.max_outstanding, now + group_size)
                break
            board.changed.clear()
            await self._wait(board.changed, 0.5)
        self.summary.paced_s += time.monotonic() - started
        m.PACED.inc(time.monotonic() - started)

    async def publish(self, group: list[Trajectory]) -> None:
        """Publish a group; returns when every member is acknowledged."""
        futures = []
        group = [msgspec.structs.replace(t, id=member_id(t.group_id, t.index)) for t in group]
        for traj in group:
            value = await self.parts.claim.pack(traj)
            key = traj.group_id.encode()
            futures.append(await self.parts.producer.send(self.trajectories_topic, value, key=key))
        await asyncio.gather(*futures)
        self.produced += len(group)
        assert self.board is not None
        await self.board.announce(self.parts.producer, self.produced)
        s = self.summary
        s.groups += 1
        s.trajectories += len(group)
        m.GROUPS.inc()
        m.TRAJECTORIES.inc(len(group))
        for traj in group:
            n = (len(traj.prompt_tokens) + len(traj.completion_tokens)) // 4
            m.TOKENS.inc(n)
            s.tokens += n
            self.mean_tokens.add(n)
            s.versions[traj.policy_version] = s.versions.get(traj.policy_version, 0) + 1

    async def _wait(self, event: asyncio.Event, timeout_s: float) -> None:
        stop = asyncio.ensure_future(self._stop.wait())
        ev = asyncio.ensure_future(event.wait())
        try:
            await asyncio.wait({stop, ev}, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for fut in (stop, ev):
                fut.cancel()


async def run_service(
    settings: Settings, *, max_groups: int | None = None, idle_exit_s: float | None = None
) -> Summary:
    """Run one generator until SIGTERM/SIGINT (or a limit); returns its summary."""
    import signal
    from contextlib import suppress

    gen = Generator(settings, max_groups=max_groups, idle_exit_s=idle_exit_s)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, gen.request_stop)
    if settings.generator.metrics_port:
        from prometheus_client import start_http_server

        start_http_server(settings.generator.metrics_port, addr="127.0.0.1")
    return await gen.run()
