"""The sandbox worker service (`rollstream sandbox-worker`).

Consumes `{prefix}.sandbox.requests` in the consumer group `{prefix}.sandbox-workers`
(read_committed), runs up to `sandbox.pool_size` jobs at once, and publishes each result on
`{prefix}.sandbox.results` (key group_id) inside a Kafka transaction that also commits the
consumed offsets (transactional id `{prefix}.sandbox-worker.{worker_id}`; a restarted
worker with the same id fences its dead predecessor). Results are published in offset
order per partition (outbox.py), so committed results and committed offsets always
match: after a SIGKILL and restart no result is lost or repeated. On top, request_id +
attempt are remembered in Redis after each commit, so a request published twice upstream
is answered once. Undecodable requests go to the DLQ (in the same transactions).
SIGTERM/SIGINT: stop consuming, let in-flight jobs finish for `shutdown_grace_s`,
publish what finished, leave the rest uncommitted for another worker, remove the pool.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from aiokafka.abc import ConsumerRebalanceListener

from sandbox_workers import metrics
from sandbox_workers.dedup import Dedup
from sandbox_workers.outbox import Entry, Outbox
from sandbox_workers.protocol import Sandbox
from schemas import topics
from schemas.codec import SchemaError
from schemas.sandbox import SandboxRequest

if TYPE_CHECKING:
    from schemas.claimcheck import ClaimCheck
    from services.settings import Settings

log = logging.getLogger("rollstream.sandbox.worker")
COMMITTED_MEMORY = 100_000
MAX_FAILED_FLUSHES = 30


@dataclass
class Publish:
    topic: str
    key: bytes
    value: bytes


@dataclass
class DeadLetter:
    kwargs: dict[str, Any] = field(default_factory=dict)


class SandboxWorker:
    def __init__(
        self,
        settings: Settings,
        sandbox: Sandbox,
        worker_id: str,
        claim_check: ClaimCheck,
        dedup: Dedup,
    ) -> None:
        prefix = settings.topics.prefix
        self.settings, self.sandbox, self.worker_id = settings, sandbox, worker_id
        self.claim_check, self.dedup = claim_check, dedup
        self.requests_topic = topics.SANDBOX_REQUESTS.full_name(prefix)
        self.results_topic = topics.SANDBOX_RESULTS.full_name(prefix)
        self.dlq_topic = topics.DLQ.full_name(prefix)
        self.group_id = f"{prefix}.sandbox-workers"
        self.transactional_id = f"{prefix}.sandbox-worker.{worker_id}"
        self.concurrency = settings.sandbox.pool_size
        self.outbox: Outbox[Any] = Outbox()
        self.tasks: dict[asyncio.Task[None], Any] = {}
        self.claimed: dict[str, Entry] = {}
        """Idempotency keys of requests consumed and not yet committed, by entry."""
        self.committed: OrderedDict[str, None] = OrderedDict()
        """Recently committed keys (Redis holds them for dedup_ttl_s)."""
        self._txn_lock = asyncio.Lock()
        self._wake = asyncio.Event()
        self._room = asyncio.Event()
        self.producer: Any = None
        self.consumer: Any = None
        self.fatal = ""
        self.commits = 0
        self.failed_flushes = 0

    async def _handle(self, record: Any, entry: Entry) -> None:
        metrics.REQUESTS.inc()
        try:
            request = await self._decode(record)
        except SchemaError as exc:
            self._finish(entry, [self._dead_letter(record, exc)])
            return
        key = self.dedup.key(request)
        if key in self.claimed or key in self.committed:  # checked and claimed atomically
            self._duplicate(entry)
            return
        self.claimed[key] = entry
        entry.key = key
        if await self.dedup.seen(key):
            self._unclaim(entry)
            self._duplicate(entry)
            return
        result = await self.sandbox.run(request)
        metrics.JOB_SECONDS.observe(result.duration_s)
        metrics.QUEUE_SECONDS.observe(result.queue_s)
        value = await self._retrying(self.claim_check.pack, result)
        out = Publish(self.results_topic, result.group_id.encode(), value)
        self._finish(entry, [out], labels=(result.outcome.value, result.verifier_name or "?"))

    def _duplicate(self, entry: Entry) -> None:
        metrics.DUPLICATES.inc()
        self._finish(entry, [])

    def _unclaim(self, entry: Entry) -> None:
        if entry.key and self.claimed.get(entry.key) is entry:
            del self.claimed[entry.key]
        entry.key = ""

    @staticmethod
    async def _retrying(fn: Any, *args: Any) -> Any:
        delay = 0.5
        while True:
            try:
                return await fn(*args)
            except SchemaError:
                raise
            except Exception as exc:  # the blob store is down: retry, never drop
                log.error("blob store error (retrying in %.1fs): %s", delay, exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 10.0)

    async def _decode(self, record: Any) -> SandboxRequest:
        """Decode a request; store outages are retried (only bad data is dead-lettered)."""
        if record.value is None:
            raise SchemaError("bytes", "value", "empty record (tombstone)")
        request: SandboxRequest = await self._retrying(
            self.claim_check.unpack, record.value, SandboxRequest
        )
        return request

    def _dead_letter(self, record: Any, exc: SchemaError) -> DeadLetter:
        metrics.DEAD_LETTERS.inc()
        return DeadLetter(
            dict(
                reason=f"undecodable sandbox request: {exc}", source_topic=record.topic,
                partition=record.partition, offset=record.offset, key=record.key,
                value=record.value, consumer=f"sandbox-worker/{self.worker_id}", error=exc,
            )
        )  # fmt: skip

    def _finish(
        self, entry: Entry, outputs: list[Any], labels: tuple[str, str] | None = None
    ) -> None:
        Outbox.finish(entry, outputs)
        if labels is not None:
            metrics.RESULTS.labels(*labels).inc()
        self._wake.set()

    async def flush(self) -> None:
        """Publish every finished prefix with its offsets in one transaction."""
        from schemas.deadletter import publish_dead_letter

        async with self._txn_lock:
            batch = self.outbox.ready()
            if not batch:
                return
            async with self.producer.transaction():
                for item in batch.outputs:
                    if isinstance(item, Publish):
                        await self.producer.send(item.topic, item.value, key=item.key)
                    else:
                        await publish_dead_letter(self.producer, self.dlq_topic, **item.kwargs)
                await self.producer.send_offsets_to_transaction(batch.offsets, self.group_id)
            keys = [e.key for e in self.outbox.commit(batch) if e.key]
            metrics.TRANSACTIONS.inc()
            self.commits += 1
            self._room.set()
            metrics.INFLIGHT.set(self.outbox.pending())
            for key in keys:
                self.claimed.pop(key, None)
                self.committed[key] = None
            while len(self.committed) > COMMITTED_MEMORY:
                self.committed.popitem(last=False)
        await self.dedup.remember(keys)

    async def _flusher(self, stop: asyncio.Event) -> None:
        while not stop.is_set() or self.tasks:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), 0.2)
            self._wake.clear()
            await self._flush_retrying()
            replaced = getattr(getattr(self.sandbox, "runner", None), "replaced", None)
            if isinstance(replaced, int):
                metrics.CONTAINERS_REPLACED.set(replaced)

    async def _flush_retrying(self) -> None:
        from aiokafka.errors import ProducerFenced

        try:
            await self.flush()
            self.failed_flushes = 0
        except ProducerFenced:
            self.fatal = (
                f"fenced: another worker runs with the transactional id {self.transactional_id}"
            )
        except Exception as exc:  # broker trouble: the batch stays in the outbox
            metrics.TRANSACTION_ERRORS.inc()
            self.failed_flushes += 1
            log.error("publishing results failed (will retry): %s", exc)
            if self.failed_flushes >= MAX_FAILED_FLUSHES:  # a restart gets a fresh producer
                self.fatal = f"publishing failed {self.failed_flushes} times in a row: {exc}"
            await asyncio.sleep(1.0)

    async def drain(self, timeout_s: float, partitions: list[Any] | None = None) -> None:
        """Let in-flight jobs (of `partitions`, or all) finish for up to timeout_s, publish
        what finished, cancel the rest (they stay uncommitted and are redelivered)."""
        mine = [t for t, p in self.tasks.items() if partitions is None or p in partitions]
        if mine:
            await asyncio.wait(mine, timeout=timeout_s)
        await self._flush_retrying()
        for t in mine:
            t.cancel()
        if mine:
            await asyncio.gather(*mine, return_exceptions=True)
        dropped = self.outbox.drop(
            partitions if partitions is not None else self.outbox.partitions()
        )
        for entry in dropped:  # not committed: the next owner answers them
            self._unclaim(entry)

    def _start(self, record: Any) -> None:
        from aiokafka import TopicPartition

        tp = TopicPartition(record.topic, record.partition)
        entry = self.outbox.add(tp, record.offset)
        task = asyncio.get_running_loop().create_task(self._handle(record, entry))
        self.tasks[task] = tp
        task.add_done_callback(self._done)
        metrics.INFLIGHT.set(self.outbox.pending())

    def _done(self, task: asyncio.Task[None]) -> None:
        self.tasks.pop(task, None)
        self._room.set()
        if not task.cancelled() and task.exception() is not None:
            # its record can never be committed: stop, so a restart redoes it
            log.error("a job failed unexpectedly; stopping", exc_info=task.exception())
            self.fatal = self.fatal or repr(task.exception())
        self._wake.set()

    async def run(self, stop: asyncio.Event) -> None:
        """Serve until `stop` is set (or a fatal error), then shut down cleanly."""
        from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

        endpoint = self.settings.kafka.endpoint
        self.producer = AIOKafkaProducer(
            bootstrap_servers=endpoint, transactional_id=self.transactional_id,
            enable_idempotence=True, acks="all", transaction_timeout_ms=60000,
        )  # fmt: skip
        self.consumer = AIOKafkaConsumer(
            bootstrap_servers=endpoint, group_id=self.group_id, enable_auto_commit=False,
            isolation_level="read_committed", auto_offset_reset="earliest",
            session_timeout_ms=10000, heartbeat_interval_ms=2000, max_poll_interval_ms=300000,
        )  # fmt: skip
        await self.producer.start()
        try:
            self.consumer.subscribe([self.requests_topic], listener=_Rebalance(self))
            await self.consumer.start()
            flusher = asyncio.get_running_loop().create_task(self._flusher(stop))
            try:
                await self._consume(stop)
            finally:
                stop.set()
                await self.drain(self.settings.sandbox.shutdown_grace_s)
                await flusher
        finally:
            with contextlib.suppress(Exception):
                await self.consumer.stop()
            await self.producer.stop()
        log.info("sandbox worker %s stopped after %d transactions", self.worker_id, self.commits)
        if self.fatal:
            raise RuntimeError(f"sandbox worker stopped: {self.fatal}")

    async def _consume(self, stop: asyncio.Event) -> None:
        """Fetch only what there is room for: at most 2 x pool size jobs running or waiting
        for a container, and at most 16 x pool size records not yet published (a slow job
        holds back the publication of later records of its partition)."""
        while not stop.is_set() and not self.fatal:
            room = min(
                2 * self.concurrency - len(self.tasks),
                16 * self.concurrency - self.outbox.pending(),
            )
            if room <= 0:
                self._room.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._room.wait(), 0.2)
                continue
            batch = await self.consumer.getmany(timeout_ms=200, max_records=room)
            for records in batch.values():
                for record in records:
                    self._start(record)


class _Rebalance(ConsumerRebalanceListener):  # type: ignore[misc]
    """Before partitions move: publish what finished, let running jobs finish briefly."""

    def __init__(self, worker: SandboxWorker) -> None:
        self.worker = worker

    async def on_partitions_revoked(self, revoked: Any) -> None:
        await self.worker.drain(REBALANCE_DRAIN_S, list(revoked))

    async def on_partitions_assigned(self, assigned: Any) -> None:
        return None


REBALANCE_DRAIN_S = 15.0


async def serve(
    settings: Settings, worker_id: str | None = None, early_stop: list[int] | None = None
) -> int:
    """Run a worker until SIGTERM/SIGINT; returns the exit code. `early_stop` collects
    signals caught before the event loop ran (they also mean: shut down cleanly)."""
    import socket

    from sandbox_workers.sandbox import docker_sandbox
    from services import blobs

    wid = worker_id or settings.sandbox.worker_id or socket.gethostname()
    if settings.sandbox.worker_metrics_port:
        from prometheus_client import start_http_server

        start_http_server(settings.sandbox.worker_metrics_port, addr="127.0.0.1")
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    if early_stop:
        stop.set()
    try:
        sandbox = await docker_sandbox(settings, wid)
    except Exception as exc:  # no image, no engine: say so plainly
        log.error("cannot start the sandbox pool: %s", exc)
        return 2
    claim_check = blobs.from_settings(settings)
    dedup = Dedup(settings.redis.endpoint, settings.topics.prefix, settings.sandbox.dedup_ttl_s)
    worker = SandboxWorker(settings, sandbox, wid, claim_check, dedup)
    log.info("sandbox worker %s: %s -> %s", wid, worker.requests_topic, worker.results_topic)
    try:
        if not stop.is_set():
            await worker.run(stop)
    except Exception as exc:
        log.error("%s", exc)
        return 1
    finally:
        await sandbox.close()
        await claim_check.aclose()
        await dedup.close()
    return 0
