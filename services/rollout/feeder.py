"""The task feeder (`rollstream feeder`): admitted tasks from built-in suites and JSONL
files, sampled across suites by weight, published on `tasks` (key task_id).

- Sources: the `train` split of every built-in suite named in `feeder.suites` (the
  `warmup` and `heldout` splits are never fed), and every task of `feeder.task_files`
  whose metadata does not put it in another split. An evaluation-only suite
  (`suites.EVAL_ONLY`, e.g. `humaneval`) is refused: named in `feeder.suites` it is a
  configuration error; a task file's task of that suite is rejected.
- Admission (services/rollout/admission.py): a malformed line, an unknown verifier, an
  unusable spec, or a reference solution that fails its own verifier (judged in-process,
  or in the sandbox tier through `sandbox.requests`/`sandbox.results`) rejects the task:
  a dead letter with the reason, and a log line. Admission runs in the background; a
  suite is sampled as soon as it has an admitted task.
- Flow control: at most `feeder.max_backlog` tasks wait for the generators (published
  minus the generators' committed offsets), at most `feeder.rate` per second; suites
  verified in the sandbox pause while the sandbox tier has more than
  `feeder.max_sandbox_backlog` requests waiting (their samples would arrive too stale);
  with `feeder.sandbox_backpressure = "all"` every suite pauses, so the mix stays as
  weighted and throughput follows the sandbox tier.
- `feeder.adapt` (services/rollout/adapting.py): a task whose groups' rewards are all equal
  is skipped more often (sampler.task_multiplier), and unless `feeder.adapt_suites` is off
  suite weights follow the share of each suite's recent groups whose rewards differ
  (sampler.adapt_multipliers). `feeder.frontier` (services/rollout/frontier.py): tasks
  are taken by the chance that their group's rewards differ, from calibration and rewards.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import msgspec

from sandbox_workers.verifiers import InProcessVerifier, default_registry
from schemas import topics
from schemas.envelope import new_id, now
from schemas.rollout import Task
from schemas.sandbox import Outcome, SandboxRequest
from services import kafka, suites
from services.rollout import admission
from services.rollout.adapting import follow_rewards
from services.rollout.frontier import Frontier
from services.rollout.sampler import SuiteSampler
from streams.groups import extract_code

if TYPE_CHECKING:
    from services.rollout.sandbox_client import SandboxClient
    from services.settings import Settings

_T = TypeVar("_T")
log = logging.getLogger("rollstream.feeder")
ADMISSION_CONCURRENCY = 8


@dataclass
class Summary:
    published: dict[str, int] = field(default_factory=dict)
    admitted: int = 0
    rejected: int = 0
    reasons: list[str] = field(default_factory=list)
    """The first rejection reasons (at most 20)."""


class Feeder:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.cfg = settings.feeder
        self.registry = default_registry()
        self.sampler = SuiteSampler(self.cfg.suites, seed=self.cfg.seed)
        self.summary = Summary()
        self.tasks_topic = kafka.topic(settings, topics.TASKS)
        self.group = kafka.group(settings, topics.GENERATORS)
        self._stop = asyncio.Event()
        self._admitting: asyncio.Task[None] | None = None
        self._adapting: asyncio.Task[None] | None = None
        self.sandboxed: set[str] = set()
        """Suites with tasks verified in the sandbox tier (flow control)."""
        self.frontier: Frontier | None = None
        """With `feeder.frontier`: the sampler's model of where the policy stands."""
        self._sandbox_checked = 0.0
        self._sandbox_backed_up = False
        self.producer: Any = None
        self.reader: Any = None
        self.admin: Any = None
        self.claim: Any = None
        self.client: SandboxClient | None = None
        self.dead: kafka.DeadLetters | None = None

    def request_stop(self) -> None:
        self._stop.set()

    # -- sources and admission ------------------------------------------------------------

    def candidates(self) -> list[Candidate]:
        """Every task of every source, parsed (file lines that do not parse carry their
        rejection reason)."""
        out: list[Candidate] = []
        for name, weight in self.cfg.suites.items():
            if weight <= 0 or name not in suites.names():
                continue
            if suites.is_eval_only(name):
                raise ValueError(
                    f"feeder.suites names {name!r}, an evaluation-only suite that is never "
                    "trained on: remove it (evaluate it with the demo or `rollstream eval`)"
                )
            suite = suites.get(name, group_size=self.cfg.group_size, max_turns=self.cfg.max_turns)
            train = [t for t in suite.tasks("train") if t.metadata.get("split", "train") == "train"]
            out += [Candidate(f"suite:{name}", i, t) for i, t in enumerate(train)]
        for path in self.cfg.task_files:
            out += self._file_tasks(Path(path))
        return self._calibrated(out)

    def _calibrated(self, out: list[Candidate]) -> list[Candidate]:
        """`out` less the tasks `feeder.calibration` measured outside `feeder.pass_band`
        (and with `feeder.skip_greedy_solved` those it records solved greedily) and the
        family members past `feeder.family_max`."""
        if self.cfg.calibration is None and not self.cfg.family_max:
            return out
        from services.suites import calibration

        cal = calibration.load(self.cfg.calibration) if self.cfg.calibration else None
        kept = [c.task for c in out if c.task is not None]
        dropped: set[int] = set()
        if cal is not None:
            kept, left = calibration.select(kept, cal, self.cfg.pass_band)
            if self.cfg.frontier:
                self.frontier = Frontier.of(kept, cal, self.cfg.adapt_floor)
                self.sampler.prior = self.frontier.chance
            dropped |= {id(t) for t in left}
            log.info("calibration %s: %d tasks fed, %d measured outside the pass band %s "
                     "left out", self.cfg.calibration, len(kept), len(left),
                     self.cfg.pass_band)  # fmt: skip
            if self.cfg.skip_greedy_solved:
                kept, left = calibration.skip_greedy_solved(kept, cal)
                dropped |= {id(t) for t in left}
                log.info("feeder.skip_greedy_solved: %d tasks fed, %d solved greedily left out",
                         len(kept), len(left))  # fmt: skip
        if self.cfg.family_max:
            kept, left = calibration.cap_families(kept, self.cfg.family_max, cal)
            dropped |= {id(t) for t in left}
            log.info("feeder.family_max %d: %d tasks fed, %d family members left out",
                     self.cfg.family_max, len(kept), len(left))  # fmt: skip
        return [c for c in out if c.task is None or id(c.task) not in dropped]

    def _file_tasks(self, path: Path) -> list[Candidate]:
        out: list[Candidate] = []
        source = f"file:{path}"
        for number, line in admission.task_lines(path.read_text()):
            try:
                task = admission.parse_line(
                    line, group_size=self.cfg.group_size, registry=self.registry
                )
            except admission.Rejected as exc:
                out.append(Candidate(source, number, None, exc.reason, line))
                continue
            if suites.is_eval_only(task.suite):
                reason = f"suite {task.suite!r} is evaluation-only: its tasks are never trained on"
                out.append(Candidate(source, number, None, reason, line))
            elif task.metadata.get("split", "train") == "train":
                out.append(Candidate(source, number, task, None, line))
        return out

    async def admit_all(self, candidates: list[Candidate]) -> None:
        """Check every candidate (bounded concurrency); admitted ones join the sampler."""
        gate = asyncio.Semaphore(ADMISSION_CONCURRENCY)

        async def one(c: Candidate) -> None:
            if c.task is not None:
                async with gate:
                    c.reason = await self.reference_problem(c.task)
            if c.task is not None and c.reason is None:
                self.sampler.add(c.task)
                if c.task.verifier.needs_sandbox:
                    self.sandboxed.add(c.task.suite)
                self.summary.admitted += 1
            else:
                await self._reject(c)

        await asyncio.gather(*(one(c) for c in candidates))
        s = self.summary
        log.info("admission done: %d admitted, %d rejected", s.admitted, s.rejected)

    async def reference_problem(self, task: Task) -> str | None:
        """Why the task's reference solution disqualifies it (None: no reference or it
        passes). In-process verifiers judge here; sandboxed ones run in the sandbox tier."""
        if not self.cfg.check_references or task.reference is None:
            return None
        plugin, why = self.registry.lookup(task.verifier)
        if plugin is None:
            return why
        if isinstance(plugin, InProcessVerifier):
            v = await plugin.judge(task.reference, task.verifier)
            return admission.reference_problem(v.outcome, v.passed, v.total, v.detail)
        for attempt in range(2):
            result = await self._sandbox_check(task, attempt)
            if result is not None and result.outcome != Outcome.SANDBOX_ERROR:
                return admission.reference_problem(
                    result.outcome, result.passed, result.total, result.detail
                )
        return "reference could not be checked: no usable sandbox verdict after 2 attempts"

    async def _sandbox_check(self, task: Task, attempt: int) -> Any:
        if self.client is None:
            from services.rollout.sandbox_client import SandboxClient

            self.client = SandboxClient(self.settings, self.producer, self.claim, "feeder")
            await self.client.start()
        d = self.settings.dispatcher
        rid = f"admission-{new_id()}"
        request = SandboxRequest(
            request_id=rid, trajectory_id=rid, group_id=rid, task_id=task.task_id,
            code=extract_code(task.reference or ""), verifier=task.verifier,
            timeout_s=d.sandbox_timeout_s, memory_mb=d.sandbox_memory_mb, attempt=attempt,
        )  # fmt: skip
        return await self.client.run(request, self.cfg.reference_timeout_s)

    async def _reject(self, c: Candidate) -> None:
        s = self.summary
        s.rejected += 1
        name = c.task.task_id if c.task is not None else f"line {c.position}"
        reason = c.reason or "rejected"
        if len(s.reasons) < 20:
            s.reasons.append(f"{c.source} {name}: {reason}")
        log.warning("rejected %s %s: %s", c.source, name, reason)
        raw = c.raw or (msgspec.json.encode(c.task).decode() if c.task is not None else "")
        assert self.dead is not None
        await self.dead.send((c.position, raw), f"task rejected: {reason}", source=c.source)

    # -- life cycle -----------------------------------------------------------------------

    async def start(self) -> None:
        from services import blobs

        self.claim = blobs.from_settings(self.settings)
        self.producer = kafka.producer(self.settings, "rollstream-feeder")
        await self.producer.start()
        self.dead = kafka.DeadLetters(self.settings, self.producer, "feeder")
        self.reader = kafka.consumer(self.settings, "rollstream-feeder-counts")
        await self.reader.start()
        self.admin = kafka.admin(self.settings)
        await self.admin.start()

    async def close(self) -> None:
        for task in (self._admitting, self._adapting):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        if self.client is not None:
            await self.client.stop()
        for client in (self.reader, self.producer):
            if client is not None:
                await client.stop()
        if self.admin is not None:
            await self.admin.close()
        if self.claim is not None:
            await self.claim.aclose()

    async def run(self) -> Summary:
        try:
            await self.start()
            self._admitting = asyncio.create_task(self.admit_all(self.candidates()))
            if self.cfg.adapt or self.frontier is not None:
                self._adapting = asyncio.create_task(
                    follow_rewards(self.settings, self.claim, self.sampler, self.frontier)
                )
            await self.feed()
        finally:
            await self.close()
        return self.summary

    # -- feeding --------------------------------------------------------------------------

    async def feed(self) -> None:
        """Publish sampled tasks until stopped or feeder.max_tasks."""
        published = 0
        next_at = time.monotonic()
        while not self._stop.is_set():
            if self.cfg.max_tasks and published >= self.cfg.max_tasks:
                return
            await self._sandbox_flow()
            if self._sandbox_backed_up and self.cfg.sandbox_backpressure == "all":
                await self._sleep(0.1)
                continue
            task = self.sampler.next()
            if task is None:
                admitted = self._admitting is None or self._admitting.done()
                if admitted and not self.sampler.paused:
                    if self._admitting is not None:
                        self._admitting.result()  # an admission crash surfaces here
                    raise RuntimeError("no admissible task in any suite with a weight above 0")
                await self._sleep(0.2)
                continue
            await self._wait_backlog()
            if self.cfg.rate:
                await self._sleep(next_at - time.monotonic())
                next_at = max(next_at, time.monotonic() - 1.0) + 1.0 / self.cfg.rate
            if self._stop.is_set():
                return
            await self.publish(task)
            published += 1

    async def publish(self, task: Task) -> None:
        fresh = msgspec.structs.replace(task, id=new_id(), created_at=now())
        await self.producer.send_and_wait(
            self.tasks_topic, await self.claim.pack(fresh), key=task.task_id.encode()
        )
        counts = self.summary.published
        counts[task.suite] = counts.get(task.suite, 0) + 1

    async def _retrying(self, call: Callable[..., Awaitable[_T]], *args: Any) -> _T:
        """await call(*args); a broker that is down (one node of a cluster restarting) is
        retried for up to a minute instead of ending the feeder."""
        from aiokafka.errors import KafkaError

        deadline = time.monotonic() + 60
        while True:
            try:
                return await call(*args)
            except KafkaError as exc:
                if time.monotonic() > deadline or self._stop.is_set():
                    raise
                log.warning("%s: %s; retrying", getattr(call, "__name__", call), exc)
                await self._sleep(1.0)

    async def backlog(self) -> int:
        """Tasks published but not yet committed by the generators' consumer group."""
        published = await self._retrying(
            kafka.record_count, self.settings, self.reader, self.tasks_topic
        )
        return published - await self._retrying(
            kafka.committed, self.admin, self.group, self.tasks_topic
        )

    async def sandbox_backlog(self) -> int:
        """Sandbox requests published but not yet answered by the sandbox workers (their
        committed offsets plus the answered records their commits mark past them)."""
        requests = kafka.topic(self.settings, topics.SANDBOX_REQUESTS)
        published = await self._retrying(kafka.record_count, self.settings, self.reader, requests)
        group = kafka.group(self.settings, topics.SANDBOX_WORKERS)
        return published - await self._retrying(kafka.committed, self.admin, group, requests)

    async def _sandbox_flow(self) -> None:
        """Pause the sandboxed suites (or, with sandbox_backpressure "all", every suite)
        while the sandbox tier is backed up (checked at most every 0.2 s)."""
        limit = self.cfg.max_sandbox_backlog
        if not limit or not self.sandboxed or time.monotonic() - self._sandbox_checked < 0.2:
            return
        self._sandbox_checked = time.monotonic()
        backed_up = await self.sandbox_backlog() > limit
        every = self.cfg.sandbox_backpressure == "all"
        if backed_up != self._sandbox_backed_up:
            state = "paused" if backed_up else "resumed"
            which = "all suites" if every else f"suites {sorted(self.sandboxed)}"
            log.info("sandbox backlog: %s %s", state, which)
        self._sandbox_backed_up = backed_up
        self.sampler.paused = set(self.sandboxed) if backed_up and not every else set()

    async def _wait_backlog(self) -> None:
        while not self._stop.is_set() and await self.backlog() >= self.cfg.max_backlog:
            await self._sleep(0.25)

    async def _sleep(self, seconds: float) -> None:
        if seconds > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), seconds)


@dataclass
class Candidate:
    """A task from a source, before admission."""

    source: str
    """suite:NAME or file:PATH."""
    position: int
    """Index in the suite, or line number in the file."""
    task: Task | None
    reason: str | None = None
    """Why it is rejected (set when parsing failed or after the reference check)."""
    raw: str = ""
    """The file line, for the dead letter."""


async def run_service(settings: Settings) -> Summary:
    """Run the feeder until SIGTERM/SIGINT or feeder.max_tasks."""
    import signal

    feeder = Feeder(settings)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, feeder.request_stop)
    return await feeder.run()
