"""The plumbing of `rollstream chaos` (services/chaos.py): its own Kafka and Redis, the
pipeline's processes, their kills and restarts, topic counts, drain and stop."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console

from schemas import topics

if TYPE_CHECKING:
    from services.rollout.supervise import Service, Supervisor
    from services.settings import Settings

ROOT = Path(__file__).resolve().parent.parent
SERVICES: dict[str, tuple[str, ...]] = {
    "sandbox-worker": ("sandbox-worker",),
    "dispatcher": ("dispatcher",),
    "learner": ("learner", "--log-level", "info"),
    "learner-standby": ("learner", "--log-level", "info"),
    "generator": ("generator", "--generator-id", "gen-0"),
    "feeder": ("feeder",),
}
"""Name -> `rollstream` arguments of each process of the pipeline."""
DRAIN_S = 240.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def chaos_settings(settings: Settings) -> Settings:
    """The demo's settings for a fresh `chaos-...` prefix, on a stack of its own, with the
    tiny policy unless demo.policy is set explicitly (the demo's default is SmolLM2, far
    too slow on a small machine for kills every few seconds to mean anything)."""
    from services.demo import run_settings

    prefix = time.strftime("chaos-%Y%m%d-%H%M%S")
    update: dict[str, Any] = {"prefix": prefix}
    if "policy" not in settings.demo.model_fields_set:
        update["policy"] = "tiny"
    demo = settings.demo.model_copy(update=update)
    s = run_settings(settings.model_copy(update={"demo": demo}))
    state = (settings.demo.report_dir / prefix / "state").resolve()
    kafka = s.kafka.model_copy(
        update={"port": _free_port(), "controller_port": _free_port(), "brokers": 1}
    )
    redis = s.redis.model_copy(update={"port": _free_port(), "url": None})
    stack = s.stack.model_copy(update={"state_dir": state})
    return s.model_copy(update={"kafka": kafka, "redis": redis, "stack": stack})


@dataclass
class ChaosStack:
    settings: Settings
    procs: Supervisor
    dir: Path
    console: Console = field(default_factory=lambda: Console(stderr=True))
    current: dict[str, Service] = field(default_factory=dict)
    counter: Any = None
    probing: asyncio.Lock = field(default_factory=asyncio.Lock)
    """One progress probe at a time on `counter` (each assigns the partitions it reads)."""
    killed: list[str] = field(default_factory=list)

    @classmethod
    def create(cls, settings: Settings) -> ChaosStack:
        from services.rollout.supervise import Supervisor

        s = chaos_settings(settings)
        run_dir = s.demo.report_dir / s.topics.prefix
        return cls(s, Supervisor(ROOT, run_dir / "logs"), run_dir)

    def say(self, text: str) -> None:
        self.console.print(f"[dim]{time.strftime('%H:%M:%S')}[/] {text}")

    # -- the stack ------------------------------------------------------------------------

    async def up(self) -> None:
        from services import topics as topic_admin
        from services.infra import stack

        self.dir.mkdir(parents=True, exist_ok=True)
        checks = await asyncio.to_thread(stack.up, self.settings, ["kafka", "redis"])
        for c in checks:
            self.say(f"{c.component}: {'ok' if c.healthy else 'DOWN'} {c.endpoint} {c.detail}")
            if not c.healthy:
                raise RuntimeError(f"chaos stack: {c.component} did not start: {c.detail}")
        await topic_admin.ensure(self.settings)
        self.say(f"run [bold]{self.settings.topics.prefix}[/]: logs in {self.dir}/logs")

    def down(self) -> None:
        """Stop the services (sandbox workers remove their containers), then the own
        Kafka and Redis. Never `stack.down`: it reaps every sandbox container of the
        shared Docker engine, other runs' included."""
        from services.infra import kafka, redis_local

        self.procs.stop_all(30)
        stopped = kafka.stop_all(self.settings, timeout_s=30)
        stopped.append(("redis", redis_local.process(self.settings).stop(timeout_s=30)))
        for name, was in stopped:
            self.say(f"own stack: {name} {'stopped' if was else 'was not running'}")

    async def _restart_infra(self, name: str) -> None:
        from services.infra import kafka, redis_local

        up = kafka.up if name == "kafka" else redis_local.up
        for _ in range(3):
            try:
                check = await asyncio.to_thread(up, self.settings)
                if check.healthy:
                    return
            except Exception as exc:  # a port still held, ...: try again
                self.say(f"[yellow]{name} restart: {exc}[/]")
            await asyncio.sleep(2.0)

    def _infra(self, name: str) -> Any:
        from services.infra import kafka, redis_local

        return (
            kafka.process(self.settings) if name == "kafka" else redis_local.process(self.settings)
        )

    # -- the services -----------------------------------------------------------------------

    def start(self, name: str) -> None:
        from services.demo import child_env

        argv = [sys.executable, "-m", "services.cli", *SERVICES[name]]
        self.current[name] = self.procs.start(name, argv, child_env(self.settings))

    def start_all(self) -> None:
        for name in SERVICES:
            self.start(name)

    def _victims(self, name: str) -> list[Service]:
        if name == "learner":  # the active one: the lease holder (the standby takes over)
            both = [self.current[n] for n in ("learner", "learner-standby")]
            holder = self._lease_pid()
            return [next((s for s in both if s.proc and s.proc.pid == holder), both[0])]
        return [self.current[name]]

    def _lease_pid(self) -> int | None:
        """The pid in the learner lease's holder (`{host}-{pid}-{random}|{token}`)."""
        import redis

        key = f"rollstream:{self.settings.topics.prefix}:learner-lease:"
        client = redis.Redis.from_url(self.settings.redis.endpoint, socket_timeout=3)
        try:
            raw = client.get(key + self.settings.learner.policy)
        except redis.RedisError:
            return None
        finally:
            client.close()
        if not isinstance(raw, bytes):
            return None
        pid = raw.decode().split("|")[0].rsplit("-", 2)
        return int(pid[1]) if len(pid) == 3 and pid[1].isdigit() else None

    def signal(self, name: str, sig: signal.Signals) -> None:
        for s in self._victims(name):
            s.signal(sig)

    async def kill(self, name: str) -> None:
        if name in ("kafka", "redis"):
            pid = self._infra(name).pid()
            if pid is not None:
                os.killpg(pid, signal.SIGKILL)
            return
        for s in self._victims(name):
            s.stopping = True
            s.signal(signal.SIGKILL)
            if s.proc is not None:
                await asyncio.to_thread(s.proc.wait, 30)
        self.killed = [s.name for s in self._victims(name)]

    async def restart(self, name: str) -> None:
        if name in ("kafka", "redis"):
            await self._restart_infra(name)
            return
        for victim in self.killed:
            self.start(victim)

    async def keep_alive(self, restarts: dict[str, int]) -> None:
        """Start again every service that exited on its own (a fenced worker, ...)."""
        while True:
            await asyncio.sleep(1.0)
            for name, s in list(self.current.items()):
                if s.crashed:
                    restarts[name] = restarts.get(name, 0) + 1
                    self.say(f"[yellow]{name} exited on its own: started again[/]\n{s.tail(3)}")
                    self.start(name)

    # -- progress ---------------------------------------------------------------------------

    async def counts(self, specs: list[topics.TopicSpec]) -> dict[topics.TopicSpec, int]:
        """End offsets summed per topic (-1 when the broker does not answer)."""
        ends = await self.ends(specs)
        return {spec: sum(ends[spec].values()) if spec in ends else -1 for spec in specs}

    async def _probe(self) -> Any:
        """The one consumer of the progress probes (read_committed, no group), started
        once; callers hold `self.probing`."""
        from services import kafka

        if self.counter is None:
            self.counter = kafka.consumer(self.settings, "rollstream-chaos")
            await asyncio.wait_for(self.counter.start(), 10)
        return self.counter

    async def ends(self, specs: list[topics.TopicSpec]) -> dict[topics.TopicSpec, dict[int, int]]:
        """Per-partition end offsets of each topic, as a read_committed reader sees them
        (the last stable offset); a topic the broker does not answer for is left out."""
        from aiokafka import TopicPartition

        from services import kafka

        out: dict[topics.TopicSpec, dict[int, int]] = {}
        async with self.probing:
            for spec in specs:
                try:
                    probe = await self._probe()
                    full = spec.full_name(self.settings.topics.prefix)
                    parts = await asyncio.wait_for(kafka.partitions(self.settings, full), 10)
                    tps = [TopicPartition(full, p) for p in parts]
                    got = await asyncio.wait_for(probe.end_offsets(tps), 10)
                    out[spec] = {tp.partition: int(o) for tp, o in got.items()}
                except Exception:
                    continue
        return out

    async def arrived(self, spec: topics.TopicSpec, base: dict[int, int], timeout_s: float) -> bool:
        """Whether a committed record reached `spec` past `base` (partition -> offset)
        within `timeout_s`, read as the dispatcher reads it (read_committed): aborted
        transactions and their markers, which move end offsets too, are not progress."""
        from aiokafka import TopicPartition

        full = spec.full_name(self.settings.topics.prefix)
        async with self.probing:
            try:
                probe = await self._probe()
            except Exception:
                return False
            tps = [TopicPartition(full, p) for p in sorted(base)]
            try:
                probe.assign(tps)
                for tp in tps:
                    probe.seek(tp, base[tp.partition])
                deadline = time.monotonic() + timeout_s
                while time.monotonic() < deadline:
                    if any((await probe.getmany(timeout_ms=500)).values()):
                        return True
                return False
            except Exception:
                return False
            finally:
                probe.unsubscribe()  # no fetch left running between probes

    async def wait_flowing(self, timeout_s: float = 600) -> None:
        """Until the learner has written ledger entries (the pipeline runs end to end)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if (await self.counts([topics.LEDGER]))[topics.LEDGER] > 0:
                self.say("the pipeline runs: ledger entries written; chaos starts")
                return
            await asyncio.sleep(2.0)
        raise RuntimeError(f"the pipeline wrote no ledger entry within {timeout_s:.0f} s")

    async def drain(self) -> None:
        """Stop the feeder and generator; wait until the audit sees nothing in flight."""
        from services import audit

        self.say("chaos over: stopping the feeder and the generator, draining")
        stop = [self.current["feeder"], self.current["generator"]]
        await asyncio.to_thread(self.procs.stop, stop, 30)
        deadline = time.monotonic() + DRAIN_S
        while time.monotonic() < deadline:
            await asyncio.sleep(5.0)
            with_grace = await audit.audit(self.settings)
            if not with_grace.in_flight and not with_grace.unaccounted:
                return
            self.say(f"draining: {with_grace.in_flight} in flight")
        self.say(f"[yellow]drain: {DRAIN_S:.0f} s passed with work in flight[/]")

    async def stop_learners(self) -> None:
        """SIGTERM the learners (final checkpoint: ledger flushed), then everything."""
        learners = [self.current["learner"], self.current["learner-standby"]]
        await asyncio.to_thread(self.procs.stop, learners, 90)
        await asyncio.sleep(3.0)
        if self.counter is not None:
            async with self.probing:
                with contextlib.suppress(Exception, asyncio.CancelledError):
                    await self.counter.stop()  # a fetch it cancels may raise
                self.counter = None

    def write(self, data: dict[str, Any]) -> None:
        (self.dir / "chaos.json").write_text(json.dumps(data, indent=2))
