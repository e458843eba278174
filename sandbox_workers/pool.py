"""The warm pool: long-lived hardened containers, one job at a time each (a `Runner`).

Each container's main process is the trusted job server (deploy/sandbox/files/jobserver.py),
started with the container; the pool keeps the container's attach stream open and writes
one job per line on the server's stdin, so no process is started with `docker exec` per
job. The server reports `started`, `result` (returned to the caller at once) and `clean`
(every process of the job dead, every writable directory empty), after which the container
takes the next job. A container is reused only after a clean job with an outcome that
leaves nothing suspicious; after a timeout, OOM, tamper, sandbox_error, a lost executor or
any doubt it is destroyed and a fresh one takes its place in the background.

`transport="exec"` instead runs a one-shot server per job with `docker exec` (the same
isolation at the per-job cost of an exec and a fresh interpreter; the benchmark compares
the two).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import random
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Final, Literal, TypeVar

from sandbox_workers import execio, reaper
from sandbox_workers.hardening import (
    SANDBOX_USER,
    SERVER_CAPS,
    SERVER_USER,
    UID_BLOCKS,
    Limits,
    container_kwargs,
)
from sandbox_workers.protocol import Execution

log = logging.getLogger("rollstream.sandbox.pool")
T = TypeVar("T")

SERVER_ARGV: Final = [
    "python3", "-I", "-S", "-c",
    "import sys; sys.path.insert(0, '/opt/rollstream'); import jobserver; jobserver.entry()",
    "--container",
]  # fmt: skip
"""The job server from its byte-compiled module (a script by path is compiled on every run)."""
REUSABLE: Final = frozenset(
    {"passed", "failed", "compile_error", "runtime_error", "output_limit"}
)  # fmt: skip
OOM_PROBE: Final = [
    "cat",
    "/sys/fs/cgroup/memory/memory.oom_control",
    "/sys/fs/cgroup/memory.events",
]
ATTACH: Final = {"stdin": 1, "stdout": 1, "stderr": 1, "stream": 1}


@dataclass(frozen=True)
class PoolConfig:
    image: str
    """Sandbox image reference."""
    limits: Limits = field(default_factory=Limits)
    size: int = 2
    docker_endpoint: str = "unix:///var/run/docker.sock"
    exec_grace_s: float = 10.0
    max_jobs_per_container: int = 1000
    acquire_timeout_s: float = 300.0
    labels: dict[str, str] = field(default_factory=dict)
    transport: Literal["server", "exec"] = "server"
    """`server`: jobs over the attach stream of the container's job server; `exec`: a
    `docker exec` of a one-shot server per job (for comparison)."""


@dataclass
class Slot:
    id: str
    uid: int
    """Base of the container's uid block (reaper.UID_LABEL)."""
    session: execio.Session | None = None
    jobs: int = 0

    @property
    def short(self) -> str:
        return self.id[:12]


def block_name(block: int) -> str:
    """The engine-wide name of the container that holds uid block `block`. The engine refuses
    a second container of one name (409 Conflict) atomically, so two pools (or workers) that
    pick the same block at the same moment never both get it."""
    return f"rollstream-uid-{block}"


class ContainerPool:
    """See the module docstring. `await start()` before use; `await close()` removes every
    container of the pool."""

    def __init__(self, cfg: PoolConfig) -> None:
        self.cfg = cfg
        self.pool_id = uuid.uuid4().hex[:12]
        self.image_digest = ""
        self.replaced = 0
        self._client: Any = None
        self._idle: asyncio.Queue[Slot] = asyncio.Queue()
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False
        self._closing = asyncio.Event()
        self._claimed: set[int] = set()
        self._lock = threading.Lock()
        # Its own threads: asyncio's default executor has min(32, cores + 4) of them, 6 on a
        # 2-core machine, which silently capped a pool of 12 at 6 jobs running at once.
        # Every container may run a job and settle the one before it at the same moment.
        self._threads = ThreadPoolExecutor(
            max_workers=2 * cfg.size + 4, thread_name_prefix=f"sandbox-pool-{self.pool_id}"
        )

    async def start(self) -> None:
        import docker

        self._client = docker.DockerClient(
            base_url=self.cfg.docker_endpoint, timeout=120, max_pool_size=self.cfg.size * 2 + 8
        )
        try:
            image = await self._call(self._client.images.get, self.cfg.image)
        except docker.errors.ImageNotFound as exc:
            raise RuntimeError(
                f"sandbox image {self.cfg.image} not found: run `rollstream up --only image`"
            ) from exc
        self.image_digest = str(image.id)
        await self._call(reaper.reap_orphans, self._client)
        slots = await asyncio.gather(*(self._call(self._create) for _ in range(self.cfg.size)))
        for slot in slots:
            self._idle.put_nowait(slot)

    async def _call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """`fn(*args, **kwargs)` (blocking Docker calls) on the pool's own threads."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._threads, functools.partial(fn, *args, **kwargs))

    def _claim_block(self) -> int:
        """A uid block no container of the engine uses and no creation of ours claims."""
        with self._lock:
            used = set(self._claimed)
            for c in self._client.api.containers(all=True, filters={"label": reaper.UID_LABEL}):
                with contextlib.suppress(ValueError):
                    used.add(int((c.get("Labels") or {}).get(reaper.UID_LABEL, "")))
            block = random.choice([b for b in random.sample(UID_BLOCKS, 64) if b not in used])
            self._claimed.add(block)
            return block

    def _create(self) -> Slot:
        for _ in range(20):
            block = self._claim_block()
            try:
                slot = self._create_with(block)
            finally:
                self._claimed.discard(block)
            if slot is not None:
                return slot
        raise RuntimeError("no free uid block for a sandbox container after 20 tries")

    def _create_with(self, block: int) -> Slot | None:
        import docker

        labels = {
            **self.cfg.labels,
            reaper.OWNER_LABEL: reaper.owner_token(),
            reaper.POOL_LABEL: self.pool_id,
            reaper.UID_LABEL: str(block),
        }
        # by id, not tag: every container runs exactly the image the results name
        kwargs = container_kwargs(
            self.image_digest, self.cfg.limits, labels, user=SERVER_USER, caps=SERVER_CAPS
        )
        server = self.cfg.transport == "server"
        command = [*SERVER_ARGV, "--base-uid", str(block)] if server else ["sleep", "infinity"]
        try:
            container = self._client.containers.create(
                command=command, stdin_open=server, name=block_name(block), **kwargs
            )
        except docker.errors.APIError as exc:
            if exc.status_code == 409:  # another creator holds this block: pick another
                return None
            raise
        try:
            session = execio.Session(container.attach_socket(params=ATTACH)) if server else None
            container.start()
        except BaseException:
            self._remove(str(container.id))
            raise
        return Slot(str(container.id), block, session)

    async def execute(self, job: dict[str, Any], limit_s: float) -> Execution:
        """Run one job on an idle container; never raises for infrastructure trouble (it
        becomes Execution.error)."""
        if self._closed:
            return Execution(None, error="the sandbox pool is closed")
        t0 = time.monotonic()
        try:
            slot = await asyncio.wait_for(self._idle.get(), self.cfg.acquire_timeout_s)
        except TimeoutError:
            return Execution(None, error="no sandbox container became available in time")
        waited = time.monotonic() - t0
        try:
            ex = await self._call(self._run_in, slot, job, limit_s)
        except asyncio.CancelledError:
            self._replace(slot)
            raise
        except Exception as exc:
            ex = Execution(None, error=f"docker: {type(exc).__name__}: {exc}"[:500])
        slot.jobs += 1
        report = ex.report or {}
        reusable = report.get("outcome") in REUSABLE and not self._closed
        reusable = reusable and slot.jobs < self.cfg.max_jobs_per_container
        if not reusable or ex.extra.get("clean") is False:
            self._replace(slot)
        elif ex.extra.get("clean") is True:
            self._idle.put_nowait(slot)
        else:  # the verdict is out; the container rejoins once the server says it is clean
            self._spawn(self._settle(slot))
        ex.where, ex.waited_s = slot.short, waited
        return ex

    def _run_in(self, slot: Slot, job: dict[str, Any], limit_s: float) -> Execution:
        payload = json.dumps(job, separators=(",", ":")).encode() + b"\n"
        timeout = limit_s + self.cfg.exec_grace_s
        if slot.session is None:
            argv = [*SERVER_ARGV, "--base-uid", str(slot.uid), "--once"]
            run = execio.run(self._client.api, slot.id, argv, SERVER_USER, payload, timeout)
            ex = self._execution(slot, run.events, run.error, run.timed_out, run.stderr)
            clean = next((e for e in run.events if e.get("event") == "clean"), None)
            ex.extra["clean"] = (clean or {}).get("clean") is True
            return ex
        events: list[dict[str, Any]] = []
        error, timed_out = "", False
        deadline = time.monotonic() + timeout
        try:
            slot.session.send(payload)
            while True:
                ev = slot.session.next_event(deadline)
                if ev is None:
                    error = "the job server's stream ended"
                    break
                events.append(ev)
                if ev.get("event") in ("result", "lost", "garbled"):
                    break
        except TimeoutError:
            timed_out = True
        except OSError as exc:
            error = f"attach stream: {type(exc).__name__}: {exc}"
        return self._execution(slot, events, error, timed_out, slot.session.demux.stderr)

    def _execution(
        self, slot: Slot, events: list[dict[str, Any]], error: str, timed_out: bool, err: bytes
    ) -> Execution:
        by_kind = {e.get("event"): e for e in reversed(events)}
        started, result, lost = by_kind.get("started"), by_kind.get("result"), by_kind.get("lost")
        ex = Execution(
            result,
            started=started is not None,
            oom_before=(started or {}).get("oom_kill"),
            error=error,
            timed_out=timed_out,
        )  # the candidate cannot signal the server: a vanished server is never its doing
        if result is None:
            if lost is not None:
                ex.oom_after, ex.error = lost.get("oom_kill"), str(lost.get("detail"))
            elif started is not None and not timed_out:
                ex.oom_after = self._probe_oom(slot)
            tail = err.decode("utf-8", "replace")[-300:]
            ex.error = "; ".join(x for x in (ex.error, tail) if x)
        return ex

    def _settle(self, slot: Slot) -> Any:
        async def settle() -> None:
            clean = await self._call(self._await_clean, slot)
            if clean and not self._closed:
                self._idle.put_nowait(slot)
            else:
                self._replace(slot)

        return settle()

    def _await_clean(self, slot: Slot) -> bool:
        assert slot.session is not None
        deadline = time.monotonic() + self.cfg.exec_grace_s
        try:
            while True:
                ev = slot.session.next_event(deadline)
                if ev is None or ev.get("event") != "clean":
                    return False
                return ev.get("clean") is True
        except (TimeoutError, OSError):
            return False

    def _probe_oom(self, slot: Slot) -> int | None:
        """The container's OOM-kill count (read by the image's plain user), or None."""
        try:
            api = self._client.api
            exec_id = api.exec_create(slot.id, OOM_PROBE, user=SANDBOX_USER)["Id"]
            text = api.exec_start(exec_id).decode("utf-8", "replace")
        except Exception:
            return None
        for line in text.splitlines():
            if line.startswith("oom_kill "):
                return int(line.split()[1])
        return None

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _replace(self, slot: Slot) -> None:
        self.replaced += 1
        self._spawn(self._renew(slot))

    async def _renew(self, old: Slot) -> None:
        with contextlib.suppress(Exception):
            await self._call(self._retire, old)
        delay = 0.5
        while not self._closed:
            try:
                slot = await self._call(self._create)
            except Exception as exc:
                log.error("cannot create a sandbox container (retrying in %.0fs): %s", delay, exc)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._closing.wait(), delay)
                delay = min(delay * 2, 30.0)
                continue
            if self._closed:
                await self._call(self._retire, slot)
            else:
                self._idle.put_nowait(slot)
            return

    def _retire(self, slot: Slot) -> None:
        if slot.session is not None:
            slot.session.close()
        self._remove(slot.id)

    def _remove(self, container_id: str) -> None:
        with contextlib.suppress(Exception):
            self._client.api.remove_container(container_id, force=True)

    async def close(self) -> None:
        """Remove every container of this pool (also ones being created right now)."""
        if self._closed:
            return
        self._closed = True
        self._closing.set()
        while self._tasks:  # settling jobs may start replacements: wait for those too
            await asyncio.gather(*list(self._tasks), return_exceptions=True)
        if self._client is None:
            await asyncio.to_thread(self._threads.shutdown)
            return
        while not self._idle.empty():
            slot = self._idle.get_nowait()
            if slot.session is not None:
                slot.session.close()
        mine = await self._call(
            self._client.api.containers,  # low-level: no inspect that a removal could fail
            all=True,
            filters={"label": f"{reaper.POOL_LABEL}={self.pool_id}"},
        )
        await asyncio.gather(*(self._call(self._remove, str(c["Id"])) for c in mine))
        await self._call(self._client.close)
        # A job still running ends with its removed container; its thread then exits too.
        await asyncio.to_thread(self._threads.shutdown)
