"""The sandbox worker (`rollstream sandbox-worker`; services/sandbox_wiring.py builds it).

Consumes `{prefix}.sandbox.requests` in the consumer group `{prefix}.sandbox-workers`
(read_committed), runs up to `sandbox.pool_size` jobs at once, and publishes each result on
`{prefix}.sandbox.results` (key group_id) inside a Kafka transaction that also commits the
consumed offsets (transactional id `{prefix}.sandbox-worker.{worker_id}`; a restarted
worker with the same id fences its dead predecessor). A result is published as soon as its
job ends; each commit's metadata marks the records past the committed offset that are
answered already (outbox.py, schemas/answered.py), and a worker that takes a partition
over reads it first (`WorkerIO.answered`) and skips them. So committed results and the
committed offsets plus metadata always match: after a SIGKILL and restart no result is
lost or repeated, and a slow job holds back no other result. On top, request_id +
attempt are remembered in Redis after each commit, so a request published twice upstream
is answered once. Undecodable requests go to the DLQ (in the same transactions).
SIGTERM/SIGINT: stop consuming, let in-flight jobs finish for `shutdown_grace_s`,
remove the pool, publish what finished, leave the rest uncommitted for another worker.

The Kafka side is a `ports.WorkerIO` (services/sandbox_wiring.py: services/kafka.py's
transactional producer and read_committed group consumer), the claim check a
`ports.ClaimChecks`; this module never builds a client itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

from sandbox_workers import metrics
from sandbox_workers.dedup import Dedup
from sandbox_workers.outbox import Entry, Outbox
from sandbox_workers.ports import (
    ClaimChecks,
    DeadLetter,
    Fenced,
    Incoming,
    Partition,
    Publish,
    WorkerIO,
)
from sandbox_workers.protocol import Sandbox
from schemas.codec import SchemaError
from schemas.sandbox import SandboxRequest

if TYPE_CHECKING:
    from sandbox_workers.config import SandboxSettings

log = logging.getLogger("rollstream.sandbox.worker")
COMMITTED_MEMORY = 100_000
MAX_FAILED_FLUSHES = 30
REBALANCE_DRAIN_S = 15.0


class SandboxWorker:
    def __init__(
        self,
        section: SandboxSettings,
        io: WorkerIO,
        sandbox: Sandbox,
        worker_id: str,
        claim_check: ClaimChecks,
        dedup: Dedup,
    ) -> None:
        self.section, self.io, self.sandbox, self.worker_id = section, io, sandbox, worker_id
        self.claim_check, self.dedup = claim_check, dedup
        self.concurrency = section.pool_size
        self.outbox: Outbox[Partition] = Outbox()
        self.tasks: dict[asyncio.Task[None], Partition] = {}
        self.claimed: dict[str, Entry] = {}
        """Idempotency keys of requests consumed and not yet committed, by entry."""
        self.committed: OrderedDict[str, None] = OrderedDict()
        """Recently committed keys (Redis holds them for dedup_ttl_s)."""
        self._txn_lock = asyncio.Lock()
        self._wake = asyncio.Event()
        self._room = asyncio.Event()
        self.fatal = ""
        self.commits = 0
        self.publishing_since: float | None = None
        """Monotonic time the publication under way began (None: none under way)."""
        self.failed_flushes = 0
        self.generation: dict[Partition, int] = {}
        """Per partition: how many times it was revoked (records fetched before a revocation
        that interleaved with `_take_over` are not started)."""

    async def _handle(self, record: Incoming, entry: Entry) -> None:
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
        out = Publish(result.group_id.encode(), value)
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

    async def _decode(self, record: Incoming) -> SandboxRequest:
        """Decode a request; store outages are retried (only bad data is dead-lettered)."""
        if record.value is None:
            raise SchemaError("bytes", "value", "empty record (tombstone)")
        request: SandboxRequest = await self._retrying(
            self.claim_check.unpack, record.value, SandboxRequest
        )
        return request

    def _dead_letter(self, record: Incoming, exc: SchemaError) -> DeadLetter:
        metrics.DEAD_LETTERS.inc()
        return DeadLetter(record, f"undecodable sandbox request: {exc}", exc)

    def _finish(
        self, entry: Entry, outputs: list[Any], labels: tuple[str, str] | None = None
    ) -> None:
        Outbox.finish(entry, outputs)
        if labels is not None:
            metrics.RESULTS.labels(*labels).inc()
        self._wake.set()

    async def flush(self) -> None:
        """Publish every finished prefix with its offsets in one transaction."""
        async with self._txn_lock:
            batch = self.outbox.ready()
            if not batch:
                return
            self.publishing_since = time.monotonic()
            try:
                await self.io.publish(batch.outputs, batch.offsets)
            finally:
                self.publishing_since = None
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
            if self._wake.is_set() and not stop.is_set():  # gather more into the transaction
                await asyncio.sleep(self.section.publish_linger_s)
            self._wake.clear()
            await self._flush_retrying()
            replaced = getattr(getattr(self.sandbox, "runner", None), "replaced", None)
            if isinstance(replaced, int):
                metrics.CONTAINERS_REPLACED.set(replaced)

    async def _flush_retrying(self) -> None:
        try:
            await self.flush()
            self.failed_flushes = 0
        except Fenced as exc:
            self.fatal = f"fenced: {exc}"
        except Exception as exc:  # broker trouble: the batch stays in the outbox
            metrics.TRANSACTION_ERRORS.inc()
            self.failed_flushes += 1
            log.error("publishing results failed (will retry): %s", exc)
            if self.failed_flushes >= MAX_FAILED_FLUSHES:  # a restart gets a fresh producer
                self.fatal = f"publishing failed {self.failed_flushes} times in a row: {exc}"
            await asyncio.sleep(1.0)

    async def drain(self, timeout_s: float, partitions: list[Partition] | None = None) -> None:
        """Let in-flight jobs (of `partitions`, or all) finish for up to timeout_s, cancel
        the rest, publish what finished (the rest stays uncommitted and is redelivered)."""
        await self._end_jobs(timeout_s, partitions)
        await self._flush_retrying()
        dropped = self.outbox.drop(
            partitions if partitions is not None else self.outbox.partitions()
        )
        for entry in dropped:  # not committed: the next owner answers them
            self._unclaim(entry)

    async def _end_jobs(self, timeout_s: float, partitions: list[Partition] | None = None) -> None:
        """Let the running jobs (of `partitions`, or all) finish for up to timeout_s, cancel
        the rest (their records stay unfinished in the outbox until `drain` drops them)."""
        mine = [t for t, p in self.tasks.items() if partitions is None or p in partitions]
        if mine:
            await asyncio.wait(mine, timeout=timeout_s)
        for t in mine:
            t.cancel()
        await asyncio.gather(*mine, return_exceptions=True)

    def _start(self, record: Incoming) -> None:
        tp = (record.topic, record.partition)
        entry = self.outbox.add(tp, record.offset)
        if entry.outputs is not None:  # answered by the partition's previous owner
            self._wake.set()
            return
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
        async with self.io.session(self._revoked):
            flusher = asyncio.get_running_loop().create_task(self._flusher(stop))
            try:
                await self._consume(stop)
            finally:
                stop.set()
                await self._end_jobs(self.section.shutdown_grace_s)
                # No job needs a container any more: remove them before any Kafka work,
                # which can outlast a supervisor's stop grace when the brokers stop too.
                await self.sandbox.close()
                await self.drain(0)
                await flusher
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
            records = await self.io.fetch(room, timeout_ms=200)
            for record in await self._take_over(records):
                self._start(record)

    async def _take_over(self, records: list[Incoming]) -> list[Incoming]:
        """Before a partition's first record: which of its records are answered already
        (the last commit's metadata). Drops the records of partitions revoked meanwhile
        (their new owner consumes them from the committed offset)."""
        new = sorted({(r.topic, r.partition) for r in records} - set(self.outbox.partitions()))
        if not new:
            return records
        seen = dict(self.generation)
        done = await self.io.answered(new)

        def still_ours(tp: Partition) -> bool:  # not revoked during the await
            return self.generation.get(tp, 0) == seen.get(tp, 0)

        for tp in filter(still_ours, new):
            self.outbox.inherit(tp, done.get(tp, set()))
        return [r for r in records if still_ours((r.topic, r.partition))]

    def stalled_for(self, now: float) -> float:
        """Seconds the publication under way has taken so far (0: none under way)."""
        return stall_s(self.publishing_since, now)

    async def _revoked(self, revoked: list[Partition]) -> None:
        """Before partitions move: publish what finished, let running jobs finish briefly."""
        for tp in revoked:
            self.generation[tp] = self.generation.get(tp, 0) + 1
        await self.drain(REBALANCE_DRAIN_S, revoked)


def stall_s(since: float | None, now: float) -> float:
    """How long an operation begun at `since` (None: none under way) has run at `now`."""
    return 0.0 if since is None else max(0.0, now - since)
