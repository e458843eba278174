"""The rollout generator service (`rollstream generator`, DESIGN.md section 7).

Consumes `tasks` in the consumer group `{prefix}.generators`; per task samples a group of
`group_size` completions with the current policy (temperature `learner.temperature`,
`generator.top_p`, `generator.max_new_tokens`), records per-token behaviour logprobs and
the policy version of every token, and publishes one Trajectory per completion on
`trajectories` (key group_id = the task message's id). The task's offset is committed
after every trajectory of its group is acknowledged (at-least-once: a crash re-samples
the task; the dispatcher keeps the first `group_size` members of a group and records the
rest in the ledger as late).

Weights: `WeightsWatcher` fetches and verifies announced weights; they are loaded between
sequences (never during one), so every token's version is exact. Pacing: before a group,
wait while it would put more than (max_lag + 1) x batch trajectories beyond the learner's
samples_consumed (services/rollout/pacing.py). Multi-turn tasks (max_turns > 1 and a
sandboxed verifier): see services/rollout/multiturn.py.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from schemas import topics
from schemas.codec import SchemaError
from schemas.rollout import Task, Trajectory
from services.rollout import episode, kafkaio, pacing
from services.rollout import metrics as m
from services.rollout.weights_watch import WeightsWatcher

if TYPE_CHECKING:
    from services.settings import Settings

log = logging.getLogger("rollstream.generator")


@dataclass
class Summary:
    groups: int = 0
    trajectories: int = 0
    tokens: int = 0
    versions: dict[int, int] = field(default_factory=dict)
    """Trajectories per policy version they started with."""
    swaps: int = 0
    weight_failures: int = 0
    paced_s: float = 0.0
    stall_escapes: int = 0
    """Groups started by pacing's liveness escape (generator.pace_stall_s)."""
    dead_letters: int = 0


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
        self.mean_tokens = pacing.RunningMean()
        self.lock = asyncio.Lock()
        """Held while sampling and while swapping weights: a swap never splits a sequence."""
        self._stop = asyncio.Event()
        self.trajectories_topic = kafkaio.topic(settings, topics.TRAJECTORIES)
        self.policy: Any = None
        self.codec: Any = None
        self.rng: Any = None
        self.consumer: Any = None
        self.producer: Any = None
        self.claim: Any = None
        self.watcher: WeightsWatcher | None = None
        self.dead: kafkaio.DeadLetters | None = None
        self.multiturn: Any = None

    def request_stop(self) -> None:
        self._stop.set()

    # -- life cycle ----------------------------------------------------------------------

    async def start(self) -> None:
        import torch

        from learner.policy import build_policy
        from learner.service import policy_spec
        from services import blobs
        from services.rollout.textcodec import for_policy

        torch.set_num_threads(self.cfg.torch_threads)
        self.policy = build_policy(policy_spec(self.settings.learner))
        self.policy.eval()
        self.codec = for_policy(self.policy)
        self.rng = torch.Generator()
        self.rng.manual_seed(self.cfg.seed if self.cfg.seed is not None else time.time_ns())
        self.claim = blobs.from_settings(self.settings)
        self.producer = kafkaio.producer(self.settings, f"rollstream-generator-{self.id}")
        await self.producer.start()
        self.dead = kafkaio.DeadLetters(
            self.settings, self.producer, f"generator {self.id}", m.DEAD_LETTERS.inc
        )
        shapes = {k: tuple(v.shape) for k, v in self.policy.state_dict().items()}
        self.watcher = WeightsWatcher(self.settings, shapes, self.dead)
        await self.watcher.start()
        self.consumer = self._task_consumer()
        await self.consumer.start()

    def _task_consumer(self) -> Any:
        from aiokafka import AIOKafkaConsumer

        prefix = self.settings.topics.prefix
        return AIOKafkaConsumer(
            kafkaio.topic(self.settings, topics.TASKS),
            bootstrap_servers=self.settings.kafka.endpoint,
            client_id=f"rollstream-generator-{self.id}",
            group_id=f"{prefix}.generators",
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            isolation_level="read_committed",
            max_poll_records=1,
        )

    async def close(self) -> None:
        for part in (self.multiturn, self.watcher):
            if part is not None:
                await part.stop()
        for client in (self.consumer, self.producer):
            if client is not None:
                await client.stop()
        if self.claim is not None:
            await self.claim.aclose()

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
        last_task = time.monotonic()
        while not self._stop.is_set():
            if self.max_groups is not None and self.summary.groups >= self.max_groups:
                return
            batches = await self.consumer.getmany(timeout_ms=500, max_records=1)
            records = [r for rs in batches.values() for r in rs]
            if not records:
                if self.idle_exit_s is not None and time.monotonic() - last_task > self.idle_exit_s:
                    return
                async with self.lock:
                    await self.swap()
                continue
            last_task = time.monotonic()
            for rec in records:
                if not await self._handle(rec):
                    break  # the group rebalanced: the rest of the batch may be another's

    async def _handle(self, rec: Any) -> bool:
        """Roll the task out and commit it; False when the commit was refused because the
        group rebalanced meanwhile (another generator joined or left): the task is then
        redelivered to the partition's new owner (at least once, like a crash)."""
        from aiokafka import TopicPartition
        from aiokafka.errors import CommitFailedError

        task = await self._decode(rec)
        if task is not None:
            group = await self.rollout(task, group_id=task.id)
            if not group:
                return True  # stopped before sampling: the task stays uncommitted
            await self.publish(group)
        tp = TopicPartition(rec.topic, rec.partition)
        try:
            await self.consumer.commit({tp: rec.offset + 1})
        except CommitFailedError:
            log.warning("commit of %s@%d refused after a rebalance; redelivered", tp, rec.offset)
            return False
        return True

    async def _decode(self, rec: Any) -> Task | None:
        assert self.dead is not None
        try:
            if rec.value is None:
                raise SchemaError("bytes", "$", "empty record (tombstone) on tasks")
            task = await self.claim.unpack(rec.value, Task)
        except SchemaError as exc:
            await self.dead.send(rec, f"undecodable Task: {exc}", exc)
            return None
        room = self.policy.max_seq_len - len(self.codec.prompt_ids(task))
        if room < 2:
            why = f"prompt leaves {room} tokens under max_seq_len {self.policy.max_seq_len}"
            await self.dead.send(rec, f"task {task.task_id} cannot be sampled: {why}")
            return None
        return task

    # -- sampling ------------------------------------------------------------------------

    async def rollout(self, task: Task, group_id: str) -> list[Trajectory]:
        """Sample the task's group (after pacing); single- or multi-turn."""
        await self.pace(task.group_size)
        if self._stop.is_set():
            return []
        if task.max_turns > 1 and task.verifier.needs_sandbox:
            return await self._multiturn().group(task, group_id)
        prompt_ids = self.codec.prompt_ids(task)
        async with self.lock:
            await self.swap()
            version = self.version
            completions = await asyncio.to_thread(self.sample, prompt_ids, task.group_size)
        return [
            episode.trajectory(
                task,
                group_id=group_id,
                index=i,
                prompt_ids=prompt_ids,
                prompt_text=self.codec.text(prompt_ids),
                parts=[self.turn(c, version)],
                generator_id=self.id,
            )
            for i, c in enumerate(completions)
        ]

    def sample(self, prompt_ids: list[int], n: int) -> list[Any]:
        """Completions of one prompt with the current weights (call under `lock`)."""
        return list(
            self.policy.sample(
                prompt_ids,
                n,
                max_new_tokens=self.cfg.max_new_tokens,
                temperature=self.settings.learner.temperature,
                top_p=self.cfg.top_p,
                generator=self.rng,
            )
        )

    def turn(self, completion: Any, version: int) -> episode.Turn:
        return episode.Turn(
            tokens=list(completion.tokens),
            logprobs=list(completion.logprobs),
            version=version,
            text=self.codec.text(completion.tokens),
            finish_reason=completion.finish_reason,
        )

    def _multiturn(self) -> Any:
        if self.multiturn is None:
            from services.rollout.multiturn import MultiTurn

            self.multiturn = MultiTurn(self)
        return self.multiturn

    async def swap(self) -> bool:
        """Load verified newer weights if there are any (call under `lock`, or before
        sampling starts). True when weights were loaded."""
        assert self.watcher is not None
        ready = self.watcher.take()
        if ready is None:
            return False
        await asyncio.to_thread(self.policy.load_weights, ready.state)
        old, self.version = self.version, ready.update.version
        m.VERSION.set(self.version)
        if old >= 0:
            self.summary.swaps += 1
            m.SWAPS.inc()
        log.info("generator %s: policy v%d -> v%d", self.id, old, self.version)
        return True

    # -- pacing and publication ----------------------------------------------------------

    async def pace(self, group_size: int) -> None:
        """Wait until a group of `group_size` fits in the staleness window."""
        if not self.cfg.pacing:
            return
        assert self.watcher is not None
        ls, started = self.settings.learner, time.monotonic()
        while not self._stop.is_set():
            published = await kafkaio.record_count(self.consumer, self.trajectories_topic)
            batch = pacing.batch_samples(
                ls.batch_tokens, self.mean_tokens.value, self.cfg.batch_samples
            )
            window = pacing.window(ls.max_lag, batch)
            consumed = self.watcher.samples_consumed
            m.OUTSTANDING.set(published - consumed)
            still = time.monotonic() - max(self.watcher.consumed_at, started)
            stalled = pacing.stalled(still, self.cfg.pace_stall_s)
            if pacing.may_start(group_size, published, consumed, window, stalled):
                if stalled:
                    self.summary.stall_escapes += 1
                    log.info("pacing: learner progress still for %.0f s; one group", still)
                break
            self.watcher.changed.clear()
            await self._wait(self.watcher.changed, 0.5)
        self.summary.paced_s += time.monotonic() - started
        m.PACED.inc(time.monotonic() - started)

    async def publish(self, group: list[Trajectory]) -> None:
        """Publish a group; returns when every member is acknowledged."""
        futures = []
        for traj in group:
            value = await self.claim.pack(traj)
            key = traj.group_id.encode()
            futures.append(await self.producer.send(self.trajectories_topic, value, key=key))
        await asyncio.gather(*futures)
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
