"""The sandbox tier's composition: real adapters for sandbox_workers' Protocols, and the
worker service (`rollstream sandbox-worker`, `sandbox exec`, the demo's evaluations).

- `StackHost`: the image this checkout builds and the stack's Docker engine
  (sandbox_workers.ports.SandboxHost).
- `KafkaWorkerIO`: the worker's Kafka IO (sandbox_workers.ports.WorkerIO) on
  services/kafka.py: a transactional producer (transactional id
  `{prefix}.sandbox-worker.{worker_id}`) and a read_committed consumer in the group
  schemas.topics.SANDBOX_WORKERS; results, dead letters and offsets in one transaction.
  Zombie fencing: aiokafka sends offsets with TxnOffsetCommit v0, which carries no group
  generation (KIP-447), so before committing each transaction the worker asks the group
  coordinator whether its generation and member id are still current (a Heartbeat with
  them); a worker that was paused past its session timeout while its partitions moved
  gets ILLEGAL_GENERATION / UNKNOWN_MEMBER_ID, aborts the transaction and stops (Fenced):
  its results never reach the dispatcher. A live member cannot lose its partitions
  within a session timeout of a successful heartbeat, and the commit follows at once.
- `docker_sandbox`, `worker`, `serve`: build the pool, the worker, and run it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from sandbox_workers.dedup import Dedup
from sandbox_workers.ports import (
    DeadLetter,
    Fenced,
    Incoming,
    Partition,
    Publish,
    Revoked,
    SandboxHost,
)
from schemas import answered, topics
from services import kafka

if TYPE_CHECKING:
    from sandbox_workers.protocol import Sandbox
    from sandbox_workers.sandbox import VerifyingSandbox
    from sandbox_workers.service import SandboxWorker
    from schemas.claimcheck import ClaimCheck
    from services.settings import Settings

log = logging.getLogger("rollstream.sandbox.worker")
TRANSACTION_TIMEOUT_MS = 15000
"""A worker's transactions are short (one batch of results); a dead worker's open one
(worker ids are unique per process, so no successor aborts it) holds back read_committed
readers of its partitions at most this long."""


class StackHost:
    """The sandbox image of this checkout's recipe on the stack's Docker engine."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    def image_ref(self) -> str:
        from services.infra import image

        return image.image_ref(self.settings)

    def docker_endpoint(self) -> str:
        from services.infra import docker_engine

        return docker_engine.endpoint(self.settings)


class KafkaWorkerIO:
    """One sandbox worker's Kafka clients (built when its session starts)."""

    def __init__(self, settings: Settings, worker_id: str) -> None:
        self.settings = settings
        self.requests_topic = kafka.topic(settings, topics.SANDBOX_REQUESTS)
        self.results_topic = kafka.topic(settings, topics.SANDBOX_RESULTS)
        self.group_id = kafka.group(settings, topics.SANDBOX_WORKERS)
        self.transactional_id = f"{settings.topics.prefix}.sandbox-worker.{worker_id}"
        self.client_id = f"sandbox-worker/{worker_id}"
        self.producer: Any = None
        self.consumer: Any = None
        self.dead_letters: kafka.DeadLetters | None = None

    @contextlib.asynccontextmanager
    async def session(self, on_revoked: Revoked) -> AsyncIterator[None]:
        s = self.settings
        self.producer = kafka.producer(
            s, self.client_id, transactional_id=self.transactional_id,
            transaction_timeout_ms=TRANSACTION_TIMEOUT_MS,
        )  # fmt: skip
        self.consumer = kafka.consumer(
            s, self.client_id, group_id=self.group_id, offset_reset="earliest",
            session_timeout_ms=10000, heartbeat_interval_ms=2000, max_poll_interval_ms=300000,
        )  # fmt: skip
        self.dead_letters = kafka.DeadLetters(s, self.producer, self.client_id)
        await self.producer.start()
        try:
            self.consumer.subscribe([self.requests_topic], listener=_rebalance(on_revoked))
            await self.consumer.start()
            yield
        finally:
            with contextlib.suppress(Exception):
                await self.consumer.stop()
            await self.producer.stop()

    async def fetch(self, max_records: int, timeout_ms: int) -> list[Incoming]:
        batch = await self.consumer.getmany(timeout_ms=timeout_ms, max_records=max_records)
        return [kafka.Record.of(m) for records in batch.values() for m in records]

    async def answered(self, partitions: Sequence[Partition]) -> dict[Partition, set[int]]:
        from aiokafka import TopicPartition

        # the same OffsetFetch the consumer's position comes from (aiokafka keeps no metadata)
        got = await self.consumer._coordinator.fetch_committed_offsets(
            [TopicPartition(*tp) for tp in partitions]
        )
        out: dict[Partition, set[int]] = {}
        for tp, meta in got.items():
            try:
                out[(tp.topic, tp.partition)] = answered.decode(meta.offset, meta.metadata or "")
            except ValueError as exc:  # another tool's metadata: redo those records
                log.warning("%s: ignoring the commit metadata of %s: %s", self.group_id, tp, exc)
        return out

    async def publish(
        self,
        outputs: Sequence[Publish | DeadLetter],
        offsets: Mapping[Partition, tuple[int, str]],
    ) -> None:
        from aiokafka import TopicPartition
        from aiokafka.errors import ProducerFenced

        assert self.dead_letters is not None, "publish outside a session"
        try:
            async with self.producer.transaction():
                for item in outputs:
                    if isinstance(item, Publish):
                        await self.producer.send(self.results_topic, item.value, key=item.key)
                    else:
                        await self.dead_letters.send(item.record, item.reason, item.error)
                commit = {TopicPartition(*tp): point for tp, point in offsets.items()}
                await self.producer.send_offsets_to_transaction(commit, self.group_id)
                await self._still_member()
        except ProducerFenced as exc:
            raise Fenced(
                f"another worker runs with the transactional id {self.transactional_id}"
            ) from exc

    async def _still_member(self) -> None:
        """Raise Fenced unless the group coordinator still knows this consumer's generation
        and member id (inside the transaction: raising aborts it)."""
        from aiokafka import errors
        from aiokafka.protocol.group import HeartbeatRequest

        coordinator = self.consumer._coordinator
        generation, member = coordinator.generation, coordinator.member_id
        if generation < 0:  # rejoining (the coordinator moved, ...): the batch is retried
            raise RuntimeError(f"{self.group_id}: not a member of a generation (rejoining)")
        response = await coordinator._send_req(HeartbeatRequest(self.group_id, generation, member))
        error = errors.for_code(response.error_code)
        if error in (errors.IllegalGenerationError, errors.UnknownMemberIdError):
            raise Fenced(
                f"{self.group_id}: generation {generation} of member {member} is no longer "
                "current (paused past the session timeout; its partitions moved)"
            )
        if error not in (errors.NoError, errors.RebalanceInProgressError):
            raise error()  # the coordinator moved, ...: retried with the batch


def _rebalance(on_revoked: Revoked) -> Any:
    """An aiokafka rebalance listener that hands revoked partitions to the worker."""
    from aiokafka.abc import ConsumerRebalanceListener

    class Listener(ConsumerRebalanceListener):  # type: ignore[misc]
        async def on_partitions_revoked(self, revoked: Any) -> None:
            await on_revoked([(tp.topic, tp.partition) for tp in revoked])

        async def on_partitions_assigned(self, assigned: Any) -> None:
            return None

    return Listener()


STALL_EXIT = 3
"""Exit status of a worker whose publication stalled (sandbox.publish_stall_s)."""


async def _watchdog(w: SandboxWorker, limit_s: float) -> None:
    """Exit the process when a publication has stalled past `limit_s`: its Kafka clients
    are wedged and no await in this loop can be trusted to return, so no clean shutdown
    is tried. The results it held are uncommitted: the next owner of the partitions
    answers them (and the dedup keys keep a finished job from running twice)."""
    import os
    import time

    while True:
        await asyncio.sleep(min(1.0, limit_s / 4))
        stalled = w.stalled_for(time.monotonic())
        if stalled > limit_s:
            log.critical(
                "publishing results has stalled for %.0fs (sandbox.publish_stall_s=%.0f): "
                "exiting so that a fresh worker takes over", stalled, limit_s,
            )  # fmt: skip
            logging.shutdown()
            os._exit(STALL_EXIT)


async def docker_sandbox(settings: Settings, worker_id: str | None = None) -> VerifyingSandbox:
    """The real sandbox: a started warm pool of hardened containers."""
    from sandbox_workers import pooled

    host: SandboxHost = StackHost(settings)
    return await pooled.docker_sandbox(settings.sandbox, host, worker_id)


def worker(
    settings: Settings, sandbox: Sandbox, worker_id: str, claim_check: ClaimCheck, dedup: Dedup
) -> SandboxWorker:
    """A sandbox worker of the run on the real Kafka."""
    from sandbox_workers.service import SandboxWorker

    io = KafkaWorkerIO(settings, worker_id)
    return SandboxWorker(settings.sandbox, io, sandbox, worker_id, claim_check, dedup)


async def serve(
    settings: Settings, worker_id: str | None = None, early_stop: list[int] | None = None
) -> int:
    """Run a worker until SIGTERM/SIGINT; returns the exit code. `early_stop` collects
    signals caught before the event loop ran (they also mean: shut down cleanly)."""
    from sandbox_workers import pooled
    from services import blobs

    wid = pooled.worker_id(settings.sandbox, worker_id)
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
    w = worker(settings, sandbox, wid, claim_check, dedup)
    requests = kafka.topic(settings, topics.SANDBOX_REQUESTS)
    log.info(
        "sandbox worker %s: %s -> %s", wid, requests, kafka.topic(settings, topics.SANDBOX_RESULTS)
    )
    watchdog = loop.create_task(_watchdog(w, settings.sandbox.publish_stall_s))
    try:
        if not stop.is_set():
            await w.run(stop)
    except Exception as exc:
        log.error("%s", exc)
        return 1
    finally:
        watchdog.cancel()
        await sandbox.close()
        await claim_check.aclose()
        await dedup.close()
    return 0
