"""The learner's service loop: rewards in; updates, weights, checkpoints and ledger out.

Order of effects, which makes "every reward trained once or dropped with a reason" hold
across crashes (DESIGN.md sections 3 and 6):

1. A record is read. Bad bytes get a dead letter; duplicates (trajectory id already seen)
   are skipped; masked, invalid, stale and no-signal samples (advantage 0,
   learner/signal.py) get a ledger entry (masked / dropped, with the reason); the rest wait
   in the batcher. Ledger entries and dead letters go to an outbox, not yet to Kafka.
2. A full batch (token budget, or `batch_max_wait_s` after its first sample) is trained
   on; each sample gets a `trained` ledger entry in the outbox.
3. Every `publish_every` steps: weights to the store (complete blob, sha256), then the
   WeightUpdate on `weights`, in the background from a snapshot (training goes on). Versions
   only increase: a restart continues after the newest announced, even past its checkpoint.
4. Every `checkpoint_every` steps (and on a clean stop): checkpoint (model, optimizer,
   RNG, version, offsets of the fully handled records, dedup window, outbox) written
   atomically; then the outbox is sent and the offsets committed; then the checkpoint is
   marked flushed. A restart resumes from the newest checkpoint; if it was not marked
   flushed, its outbox is sent again (same message ids, so readers dedup). Work after the
   checkpoint is redone, and its outbox was never sent, so nothing is counted twice.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from learner import signal, staleness
from learner.batching import TokenBudgetBatcher
from learner.bookkeeping import DedupWindow, OffsetTracker, OutboxProducer, Summary
from learner.checkpoint import CheckpointManager, CheckpointState
from learner.io import LearnerIO, Record
from learner.metrics import LearnerMetrics
from learner.publish import snapshot, store_and_announce
from learner.sample import Sample, from_scored, problem
from learner.trainer import Trainer
from learner.weights import WeightStore, announced_readable
from schemas import codec
from schemas.deadletter import publish_dead_letter
from schemas.messages import LedgerEntry, LedgerStatus, ScoredTrajectory, WeightUpdate

log = logging.getLogger(__name__)
Unpack = Callable[[bytes], Awaitable[ScoredTrajectory]]


@dataclass(frozen=True, kw_only=True)
class LoopConfig:
    """The loop's knobs: the same-named keys of `[learner]` (learner/config.py documents
    them and holds their defaults; `loop_config(section, prefix)` builds one), the topics,
    and the run's limits."""

    policy: str
    rewards_topic: str
    weights_topic: str
    ledger_topic: str
    dlq_topic: str
    max_lag: int
    skip_no_signal: bool
    kl_coef: float
    entropy_coef: float
    batch_tokens: int
    batch_max_wait_s: float
    publish_every: int
    publish_dtype: str
    checkpoint_every: int
    dedup_window: int
    writer: str = "learner-0"
    """Who writes the ledger entries and dead letters."""
    poll_s: float = 0.5
    """Longest wait of one poll of `rewards`."""
    max_steps: int | None = None
    max_seconds: float | None = None
    idle_exit_s: float | None = None
    """Stop after this long without records and with nothing pending (tests, benchmarks)."""


@dataclass
class _Pending:
    sample: Sample
    partition: int
    offset: int
    lag: int | None


class Learner:
    def __init__(
        self,
        cfg: LoopConfig,
        trainer: Trainer,
        store: WeightStore,
        checkpoints: CheckpointManager,
        io: LearnerIO,
        unpack: Unpack,
        metrics: LearnerMetrics | None = None,
    ) -> None:
        self.cfg = cfg
        self.trainer = trainer
        self.store = store
        self.ckpt = checkpoints
        self.io = io
        self.unpack = unpack
        self.metrics = metrics
        self.version = -1
        self.samples_consumed = self.generated_consumed = 0
        """Samples settled (trained, dropped, masked); of them, generated (version >= 0)."""
        self.tracker = OffsetTracker()
        self.dedup = DedupWindow(cfg.dedup_window)
        self.batcher: TokenBudgetBatcher[_Pending] = TokenBudgetBatcher(
            cfg.batch_tokens, lambda p: p.sample.length
        )
        self.inflight: set[str] = set()
        self.outbox: list[tuple[str, bytes | None, bytes]] = []
        self.last_publish_step = self.last_ckpt_step = 0
        self.pending_since: float | None = None
        self.drops_since: float | None = None
        self._publishing: asyncio.Task[WeightUpdate] | None = None
        self.summary = Summary()
        self._stop = asyncio.Event()
        self._started = time.monotonic()

    def request_stop(self) -> None:
        self._stop.set()

    # -- start -------------------------------------------------------------------------

    async def restore(self) -> None:
        """Resume from the newest checkpoint (or start fresh), then position the consumer."""
        announced = await self.io.last_value(self.cfg.weights_topic, self.cfg.policy.encode())
        last = codec.decode(announced, WeightUpdate).version if announced else -1
        policy, opt = self.trainer.policy, self.trainer.optimizer
        loaded = self.ckpt.load_latest(policy, opt)  # type: ignore[arg-type]
        if loaded is None:
            log.info("no checkpoint: starting fresh after announced version %d", last)
            self.version = last
            await self.publish()
            await self.io.seek({})
            return
        path, st = loaded
        self.trainer.steps = self.last_ckpt_step = st.step
        self.last_publish_step = int(st.extra.get("last_publish_step", st.step))
        self.version = max(st.version, last)
        self.samples_consumed = st.samples_consumed
        self.generated_consumed = int(st.extra.get("generated", st.samples_consumed))
        self.dedup = DedupWindow(self.cfg.dedup_window, st.extra.get("dedup", []))
        offsets = st.offsets.get(self.cfg.rewards_topic, {})
        self.tracker = OffsetTracker(offsets)
        if not self.ckpt.is_flushed(path):
            await self._flush(path, st.outbox, offsets)
        log.info("resumed from %s: step %d, version %d", path.name, st.step, self.version)
        if announced and not await asyncio.to_thread(announced_readable, self.store, announced):
            await self.publish()  # the store lost the announced blob: the checkpoint's weights
        await self.io.seek(offsets)

    # -- main loop ---------------------------------------------------------------------

    async def run(self) -> Summary:
        t0 = time.monotonic()
        started = self._started = t0
        try:
            await self.restore()
            started = self._started = last_data = time.monotonic()
            self.summary.restore_s = started - t0
            while not self._stop.is_set() and not self._limits_reached(started):
                t0 = time.monotonic()
                records = await self.io.poll(self.cfg.poll_s, max_records=1024)
                self.summary.wait_s += time.monotonic() - t0
                if records:
                    last_data = time.monotonic()
                for rec in records:
                    batch = await self._handle(rec)
                    if batch:
                        await self._train(batch)
                    if self._limits_reached(started):
                        break
                if self._batch_overdue():
                    await self._train(self.batcher.flush())
                if self._drops_due():  # nothing to train, entries waiting: flush them
                    await self.checkpoint()
                    last_data = time.monotonic()  # idle counts from the end of the flush
                idle = self.cfg.idle_exit_s
                if (
                    idle is not None
                    and not len(self.batcher)
                    and time.monotonic() - last_data > idle
                ):
                    break
            await self._finish()
        finally:
            if self._publishing is not None:  # a crash: let the one snapshotted go out
                await asyncio.gather(self._publishing, return_exceptions=True)
            self.summary.wall_s = time.monotonic() - started
            self.summary.steps, self.summary.version = self.trainer.steps, self.version
        return self.summary

    def _limits_reached(self, started: float) -> bool:
        c = self.cfg
        if c.max_steps is not None and self.trainer.steps >= c.max_steps:
            return True
        return c.max_seconds is not None and time.monotonic() - started >= c.max_seconds

    def _batch_overdue(self) -> bool:
        if not len(self.batcher) or self.pending_since is None:
            return False
        return time.monotonic() - self.pending_since >= self.cfg.batch_max_wait_s

    def _drops_due(self) -> bool:
        """Ledger entries wait in the outbox with nothing to train for `batch_max_wait_s`
        (at least 1 s): a stream of only stale or masked samples, or an idle learner."""
        if not self.outbox or len(self.batcher):
            self.drops_since = None
            return False
        self.drops_since = self.drops_since or time.monotonic()
        return time.monotonic() - self.drops_since >= max(self.cfg.batch_max_wait_s, 1.0)

    async def _finish(self) -> None:
        await self._published()
        if self.trainer.steps > self.last_publish_step:
            await self.publish()
        if self.trainer.steps > self.last_ckpt_step or self.outbox:
            await self.checkpoint()

    # -- one record --------------------------------------------------------------------

    def _count(self, status: str, n: int = 1) -> None:
        self.summary.counts[status] = self.summary.counts.get(status, 0) + n
        if self.metrics is not None:
            self.metrics.fate(status, n)

    async def _handle(self, rec: Record) -> list[_Pending] | None:
        self.tracker.seen(rec.partition, rec.offset)
        try:
            if rec.value is None:
                raise codec.SchemaError("bytes", "$", "empty record (tombstone) on rewards")
            msg = await self.unpack(rec.value)
        except codec.SchemaError as exc:
            await publish_dead_letter(
                OutboxProducer(self.outbox),
                self.cfg.dlq_topic,
                reason=f"undecodable ScoredTrajectory: {exc}",
                source_topic=rec.topic,
                partition=rec.partition,
                offset=rec.offset,
                key=rec.key,
                value=rec.value,
                consumer=self.cfg.writer,
                error=exc,
            )
            self.tracker.done(rec.partition, rec.offset)
            self._count("dead_letter")
            return None
        sample = from_scored(msg)
        tid = sample.trajectory_id
        if tid in self.dedup or tid in self.inflight:
            self.tracker.done(rec.partition, rec.offset)
            self._count("duplicate")
            return None
        lag = staleness.lag(self.version, sample.version)
        if msg.masked:
            self._settle(rec, sample, LedgerStatus.MASKED, msg.mask_reason)
            return None
        p = self.trainer.policy
        reason = (
            problem(sample, p.vocab_size, p.max_seq_len)
            or staleness.stale_reason(lag, self.cfg.max_lag)
            or self._no_signal(sample)
        )
        if reason is not None:
            self._settle(rec, sample, LedgerStatus.DROPPED, reason)
            return None
        self.inflight.add(tid)
        if not len(self.batcher):
            self.pending_since = time.monotonic()
        return self.batcher.add(_Pending(sample, rec.partition, rec.offset, lag))

    def _no_signal(self, sample: Sample) -> str | None:
        c = self.cfg
        if not c.skip_no_signal:
            return None
        has_behaviour = sample.behaviour_logp is not None
        return signal.no_signal_reason(
            sample.advantage, has_behaviour, kl_coef=c.kl_coef, entropy_coef=c.entropy_coef
        )

    def _settle(self, rec: Record, sample: Sample, status: LedgerStatus, reason: str) -> None:
        self._record(sample, status, reason)
        self.tracker.done(rec.partition, rec.offset)
        self._count(status.value)

    def _record(self, sample: Sample, status: LedgerStatus, reason: str = "") -> None:
        entry = LedgerEntry(
            trajectory_id=sample.trajectory_id,
            group_id=sample.group_id,
            status=status,
            reason=reason,
            policy_version=max(sample.version, -1),
            learner_step=self.trainer.steps if status is LedgerStatus.TRAINED else -1,
            writer=self.cfg.writer,
        )
        self.outbox.append(
            (self.cfg.ledger_topic, sample.trajectory_id.encode(), codec.encode(entry))
        )
        self.dedup.add(sample.trajectory_id)
        self.samples_consumed += 1
        self.generated_consumed += sample.version >= 0 and sample.origin == "live"

    # -- training, publication, checkpoints -------------------------------------------

    async def _train(self, batch: list[_Pending]) -> None:
        if not batch:
            return
        self.pending_since = None
        result = await asyncio.to_thread(self.trainer.step, [p.sample for p in batch])
        self.summary.train_s += result.seconds
        self.summary.tokens += result.tokens
        for p in batch:
            self._record(p.sample, LedgerStatus.TRAINED)
            self.tracker.done(p.partition, p.offset)
            self.inflight.discard(p.sample.trajectory_id)
        self._count("trained", len(batch))
        stats = dict(result.stats)
        stats["tokens_per_s"] = result.tokens / max(result.seconds, 1e-9)
        stats["wait_frac"] = self.summary.wait_s / max(time.monotonic() - self._started, 1e-9)
        lags = [p.lag for p in batch if p.lag is not None]
        if self.metrics is not None:
            self.metrics.step(self.trainer.steps, result.steps, stats, lags, result.tokens)
        log.info(
            "step %d v%d: loss %.4f reward %.3f ratio %.3f clip %.3f tok/s %.0f",
            self.trainer.steps,
            self.version,
            stats["loss"],
            stats["reward_mean"],
            stats["ratio_mean"],
            stats["clip_frac"],
            stats["tokens_per_s"],
        )
        if self.trainer.steps - self.last_publish_step >= self.cfg.publish_every:
            await self.publish(behind=True)
        if self.trainer.steps - self.last_ckpt_step >= self.cfg.checkpoint_every:
            await self.checkpoint()

    async def publish(self, behind: bool = False) -> WeightUpdate | None:
        """Store, then announce (a complete blob); ``behind``: return once snapshotted."""
        await self._published()
        t0, step = time.monotonic(), self.trainer.steps
        state = await asyncio.to_thread(snapshot, self.trainer, self.cfg.publish_dtype)
        self.last_publish_step = step
        self._publishing = asyncio.create_task(self._store_and_announce(state, step, t0))
        return None if behind else await self._published()

    async def _published(self) -> WeightUpdate | None:  # the one in flight; its failure raises
        task, self._publishing = self._publishing, None
        return None if task is None else await task

    async def _store_and_announce(
        self, state: dict[str, Any], step: int, t0: float
    ) -> WeightUpdate:
        update = await store_and_announce(self.store, self.io, self.cfg, state,
                                          version=self.version + 1, step=step,
                                          samples_consumed=self.samples_consumed)  # fmt: skip
        self.version = update.version
        self.summary.publish_s += time.monotonic() - t0
        if self.metrics is not None:
            self.metrics.published(update.version, time.monotonic() - t0)
        log.info("published version %d (step %d) at %s", update.version, step, update.uri)
        return update

    async def checkpoint(self) -> None:
        await self._published()
        t0 = time.monotonic()
        offsets = self.tracker.committable()
        state = CheckpointState(
            version=self.version,
            step=self.trainer.steps,
            samples_consumed=self.samples_consumed,
            offsets={self.cfg.rewards_topic: offsets},
            outbox=self.outbox,
            extra={
                "dedup": self.dedup.to_list(),
                "last_publish_step": self.last_publish_step,
                "generated": self.generated_consumed,
            },
        )
        policy, opt = self.trainer.policy, self.trainer.optimizer
        path = await asyncio.to_thread(self.ckpt.save, state, policy, opt)  # type: ignore[arg-type]
        items, self.outbox = self.outbox, []
        self.last_ckpt_step = self.trainer.steps
        await self._flush(path, items, offsets)
        self.summary.checkpoint_s += time.monotonic() - t0

    async def _flush(
        self, path: Path, items: list[tuple[str, bytes | None, bytes]], offsets: dict[int, int]
    ) -> None:
        await self.io.send_all(items)
        await self.io.commit(offsets)
        self.ckpt.mark_flushed(path)
