"""`rollstream demo`: the whole pipeline on the local stack, learning a task end to end.

1. Bring the stack up (Kafka, Redis, Docker, sandbox image) and make a fresh run prefix.
2. Initial policy: a few seconds of supervised warm-up on the suites' `warmup` split
   (services/rollout/warmup.py); evaluate it on the `heldout` split ("before"); make it
   version 0 of the run (weight store, learner checkpoint, `weights` announcement).
3. Start the services as processes, each `python -m services.cli ...` with the run's
   settings in its environment: sandbox worker(s), reward dispatcher, learner,
   generator(s), feeder. Logs go to `runs/<prefix>/logs/`.
4. Show live progress (reward, throughput, policy version, outstanding, staleness) until
   `demo.budget_minutes` pass; then stop the feeder and generators, let in-flight
   trajectories be scored and trained (`demo.drain_s` at most), stop the learner (its
   final checkpoint flushes the ledger), the dispatcher and the sandbox workers.
5. Evaluate the final policy on the same held-out tasks ("after") and write the report:
   `runs/<prefix>/plot.png`, `report.md`, `summary.json`, `metrics.jsonl`.

Ctrl-C at any point stops every service (SIGTERM to its process group, SIGKILL after a
grace period); sandbox workers remove their containers on the way out.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console

from services.rollout.stats import Row, RunStats
from services.settings import Settings

if TYPE_CHECKING:
    from services.rollout.evaluate import EvalResult
    from services.rollout.monitor import Monitor
    from services.rollout.supervise import Supervisor

ROOT = Path(__file__).resolve().parent.parent
CHILD_SECTIONS = (
    "kafka", "redis", "docker", "sandbox", "topics", "blobs", "dispatcher", "rewards",
    "learner", "generator", "feeder", "stack",
)  # fmt: skip
"""Sections handed to the services verbatim (as ROLLSTREAM__<SECTION> JSON)."""


def run_settings(settings: Settings) -> Settings:
    """The demo's settings: the model `demo.policy` names unless learner.model is set, a
    fresh prefix unless one is set, and the overrides of that model (`demo.overrides`,
    DemoSettings.overrides_for) applied to every field not set explicitly (by TOML,
    environment or --set); `demo.two_turn` sets feeder.max_turns to 2."""
    prefix = settings.demo.prefix or time.strftime("demo-%Y%m%d-%H%M%S")
    if "model" not in settings.learner.model_fields_set:
        learner = settings.learner.model_copy(update={"model": settings.demo.policy})
        settings = settings.model_copy(update={"learner": learner})
    overrides = settings.demo.overrides_for(settings.learner.model)
    if settings.demo.two_turn:
        overrides["feeder.max_turns"] = "2"
    sections: dict[str, dict[str, Any]] = {}
    for key, value in overrides.items():
        section, _, name = key.partition(".")
        current = getattr(settings, section, None)
        if current is None or name not in type(current).model_fields:
            raise ValueError(f"demo.overrides: unknown setting {key!r}")
        if name not in current.model_fields_set:
            sections.setdefault(section, {})[name] = value
    updates: dict[str, Any] = {}
    for section, values in sections.items():
        current = getattr(settings, section)
        updates[section] = type(current).model_validate({**current.model_dump(), **values})
    topics = updates.get("topics", settings.topics)
    updates["topics"] = topics.model_copy(update={"prefix": prefix})
    return settings.model_copy(update=updates)


def child_env(settings: Settings) -> dict[str, str]:
    env = dict(os.environ)
    for name in CHILD_SECTIONS:
        env[f"ROLLSTREAM__{name.upper()}"] = getattr(settings, name).model_dump_json()
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    return env


def evaluated(heldout: list[Any], count: int) -> list[Any]:
    """The held-out tasks the demo evaluates: the first `count` of the split (a fixed
    subset), every one when `count` is 0."""
    return heldout[: count or None]


def sandboxed_suites(settings: Settings) -> bool:
    """Whether any task fed may need the sandbox tier."""
    from services import suites

    fed = [n for n, w in settings.feeder.suites.items() if w > 0]
    return bool(settings.feeder.task_files) or any(n != "arith" for n in fed if n in suites.names())


class Demo:
    def __init__(self, settings: Settings, console: Console) -> None:
        self.s = run_settings(settings)
        self.cfg = self.s.demo
        self.console = console
        self.dir = self.cfg.report_dir / self.s.topics.prefix
        self.stats = RunStats()
        self.rows: list[Row] = []
        self.monitor: Monitor | None = None
        self.procs: Supervisor | None = None
        self.started = 0.0
        self.stopped = 0.0
        self.before: list[EvalResult] = []
        self.after: list[EvalResult] = []
        self.cancelled = threading.Event()
        """Set when the run is cancelled: work in threads stops at its next check."""
        self.initial_state: dict[str, Any] | None = None
        """Weights of the initial policy; unset: the supervised warm-up makes them."""
        self.final_version = -1

    def say(self, text: str) -> None:
        self.console.print(text)

    # -- phases ---------------------------------------------------------------------------

    async def run(self) -> int:
        from services import topics
        from services.rollout.supervise import Supervisor

        if not await asyncio.to_thread(self._stack_up):
            return 1
        self.dir.mkdir(parents=True, exist_ok=True)
        self.say(f"run [bold]{self.s.topics.prefix}[/]: report and logs in {self.dir}/")
        await topics.ensure(self.s)
        self.procs = Supervisor(ROOT, self.dir / "logs")
        try:
            if sandboxed_suites(self.s):
                self._start_sandbox_workers()
            policy, text = await self._initial_policy()
            self._start_pipeline()
            rc = await self._watch()
            if rc == 0:
                await self._drain()
                await self._final_eval(policy, text)
        finally:
            await self._cleanup()
        self._report()
        return rc

    def _stack_up(self) -> bool:
        from services.infra import stack

        self.console.rule("[bold]rollstream demo: local stack")
        checks = stack.up(self.s, ["kafka", "redis", "docker", "image", "model"])
        for c in checks:
            mark = "[green]ok[/]" if c.healthy else "[red]DOWN[/]"
            self.say(f"{mark} {c.component:<7} {c.version:<14} {c.endpoint}  {c.detail}")
            if not c.healthy and c.fix:
                self.say(f"    [yellow]fix:[/] {c.fix}")
        return all(c.healthy for c in checks)

    async def _initial_policy(self) -> tuple[Any, Any]:
        from services.rollout import warmup

        policy, text = await asyncio.to_thread(self._warmup)
        self.before = await self._evaluate(policy, text, "before")
        update = await warmup.seed_learner(self.s, policy)
        self.say(f"initial policy published as version {update.version} ({update.uri})")
        return policy, text

    def _warmup(self) -> tuple[Any, Any]:
        import torch

        from learner.spec import make_policy
        from services.models import resolved
        from services.rollout import warmup
        from services.rollout.textcodec import for_policy

        torch.set_num_threads(1)
        self.console.rule("[bold]initial policy")
        policy = make_policy(resolved(self.s))
        text = for_policy(policy)
        if self.initial_state is not None:
            policy.load_weights(self.initial_state)
            policy.train(False)
            return policy, text
        t0 = time.monotonic()

        def on_step(step: int, loss: float) -> None:
            if self.cancelled.is_set():  # Ctrl-C: the thread stops at the next step
                raise KeyboardInterrupt

        pairs = warmup.warmup_pairs(self.s)
        losses = warmup.supervised(policy, text, pairs, self.s, on_step=on_step)
        if losses:
            self.say(
                f"supervised warm-up: {len(losses)} steps in {time.monotonic() - t0:.1f} s, "
                f"loss {losses[0]:.2f} -> {losses[-1]:.2f} (warmup split only)"
            )
        return policy, text

    async def _evaluate(self, policy: Any, text: Any, label: str) -> list[EvalResult]:
        from services import suites

        out = []
        fed = [n for n, w in self.s.feeder.suites.items() if w > 0 and n in suites.names()]
        chosen = {n: self.cfg.eval_tasks for n in fed} | dict(self.cfg.eval_extra)
        for name, count in chosen.items():
            tasks = evaluated(suites.get(name).tasks("heldout"), count)
            t0 = time.monotonic()
            r = await self._evaluate_suite(policy, text, tasks)
            none_sampled = math.isnan(r.sampled_pass)
            sampled = "" if none_sampled else f", sampled pass {r.sampled_pass:.3f}"
            self.say(
                f"held-out {label:<6} {name:<9} ({r.tasks} tasks): greedy pass "
                f"{r.greedy_pass:.3f} ± {r.greedy_se:.3f}{sampled} "
                f"({time.monotonic() - t0:.0f} s)"
            )
            out.append(r)
        return out

    async def _evaluate_suite(self, policy: Any, text: Any, tasks: list[Any]) -> EvalResult:
        from services.rollout import evaluate

        n = self.cfg.eval_samples
        if not tasks[0].verifier.needs_sandbox:
            judge = evaluate.in_process_judge(self.s)
            return await evaluate.evaluate(policy, text, tasks, judge, self.s, n)
        from services.sandbox_wiring import docker_sandbox

        sandbox = await docker_sandbox(self.s, f"{self.s.topics.prefix}-eval")
        try:
            judge = evaluate.sandbox_judge(self.s, sandbox)
            return await evaluate.evaluate(policy, text, tasks, judge, self.s, n)
        finally:
            await sandbox.close()

    def _service(self, name: str, module: str, *args: str) -> None:
        assert self.procs is not None
        argv = [sys.executable, "-m", module, *args]
        self.procs.start(name, argv, child_env(self.s))

    def _start_sandbox_workers(self) -> None:
        for i in range(self.cfg.sandbox_workers):
            wid = f"{self.s.topics.prefix}-sw{i}"
            args = ("sandbox-worker", "--worker-id", wid)
            self._service(f"sandbox-worker-{i}", "services.cli", *args)

    def _start_pipeline(self) -> None:
        self.console.rule("[bold]streaming RL")
        for i in range(self.cfg.dispatchers):
            name = "dispatcher" if i == 0 else f"dispatcher-{i}"
            self._service(name, "services.cli", "dispatcher")
        self._service("learner", "services.cli", "learner", "--log-level", "warning")
        for i in range(self.cfg.generators):
            gid = f"gen-{i}"
            self._service(gid, "services.cli", "generator", "--generator-id", gid)
        self._service("feeder", "services.cli", "feeder")
        self.started = time.monotonic()
        self.stats.t0 = time.time()
        assert self.procs is not None
        pids = {p.name: p.proc.pid for p in self.procs.services if p.proc is not None}
        (self.dir / "services.json").write_text(json.dumps({"demo": os.getpid(), **pids}))

    async def _watch(self) -> int:
        from services.rollout import live
        from services.rollout.monitor import Monitor

        assert self.procs is not None
        self.monitor = Monitor(self.s, self.stats)
        await self.monitor.start()
        budget = self.cfg.budget_minutes * 60
        return await live.watch(self, budget)

    def snapshot(self) -> Row:
        row = self.stats.row(time.time(), time.monotonic() - self.started)
        self.rows.append(row)
        with (self.dir / "metrics.jsonl").open("a") as f:
            f.write(json.dumps(row.to_json()) + "\n")
        return row

    async def _drain(self) -> None:
        from services.rollout import live

        assert self.procs is not None and self.monitor is not None
        procs = self.procs
        self.say("budget reached: stopping the feeder and generators, draining in-flight work")
        await asyncio.to_thread(procs.stop, procs.named("feeder") + procs.named("gen-"), 30)
        await live.drain(self)
        await asyncio.to_thread(procs.stop, procs.named("learner"), 90)
        await live.settle_ledger(self)
        self.stopped = time.monotonic()
        self.snapshot()
        await asyncio.to_thread(procs.stop_all, 60)

    async def _final_eval(self, policy: Any, text: Any) -> None:
        from learner.weights import fetch
        from schemas import codec, topics
        from schemas.learning import WeightUpdate
        from services.learner_kafka import last_value

        prefix, ls = self.s.topics.prefix, self.s.learner
        raw = await last_value(self.s, topics.WEIGHTS.full_name(prefix), ls.policy.encode())
        if raw is None:
            return
        update = codec.decode(raw, WeightUpdate)
        state = await asyncio.to_thread(
            fetch, update.uri, update.sha256, redis_url=self.s.redis.endpoint
        )
        policy.load_weights(state)
        policy.train(False)
        self.final_version = update.version
        self.after = await self._evaluate(policy, text, "after")

    async def _cleanup(self) -> None:
        self.cancelled.set()
        if self.monitor is not None:
            await self.monitor.stop()
        if self.procs is not None:
            await asyncio.to_thread(self.procs.stop_all, 30)

    def _report(self) -> None:
        from services.rollout import live, report

        minutes = ((self.stopped or time.monotonic()) - (self.started or time.monotonic())) / 60
        rep = report.Report(
            prefix=self.s.topics.prefix,
            minutes=minutes,
            rows=self.rows,
            per_version=self.stats.per_version,
            before=self.before,
            after=self.after,
            accounting=live.accounting(self),
            final_version=max(self.final_version, self.stats.version),
            settings=json.loads(self.s.model_dump_json(include=set(CHILD_SECTIONS) | {"demo"})),
        )
        plot_path, md = report.write(rep, self.dir)
        live.print_summary(self, rep, plot_path, md)


def run_demo(settings: Settings) -> int:
    """Entry point of `rollstream demo`; returns the exit code."""
    console = Console()
    try:
        demo = Demo(settings, console)
    except ValueError as exc:
        console.print(f"[red]rollstream demo: {exc}[/]")
        return 2
    try:
        return asyncio.run(demo.run())
    except KeyboardInterrupt:
        console.print("[yellow]interrupted: every service was stopped[/]")
        return 130
