"""The warm pool: long-lived hardened containers, one job at a time each (a `Runner`).

Each container runs init + an idle keeper as SANDBOX_USER; a job is `docker exec` of the
executor under the container's own job uid, with the job on stdin (execio.py). A container
is reused only after a job that ended cleanly (the executor confirmed that every process of
the job is dead and every writable directory is empty) with an outcome that leaves nothing
suspicious; after a timeout, OOM, tamper, sandbox_error, a vanished executor or any doubt it
is destroyed and a fresh one takes its place in the background.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Final

from sandbox_workers import execio, reaper
from sandbox_workers.hardening import JOB_UIDS, SANDBOX_USER, Limits, container_kwargs
from sandbox_workers.protocol import Execution

log = logging.getLogger("rollstream.sandbox.pool")

EXECUTOR_ARGV: Final = [
    "python3", "-I", "-S", "-c",
    "import sys; sys.path.insert(0, '/opt/rollstream'); import executor; executor.entry()",
    "--container",
]  # fmt: skip
"""The executor from its byte-compiled module (a script by path is compiled on every run)."""
REUSABLE: Final = frozenset(
    {"passed", "failed", "compile_error", "runtime_error", "output_limit"}
)  # fmt: skip
OOM_PROBE: Final = [
    "cat",
    "/sys/fs/cgroup/memory/memory.oom_control",
    "/sys/fs/cgroup/memory.events",
]


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


@dataclass
class Slot:
    id: str
    uid: int
    jobs: int = 0

    @property
    def short(self) -> str:
        return self.id[:12]


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
        self._uids: set[int] = set()

    async def start(self) -> None:
        import docker

        self._client = docker.DockerClient(
            base_url=self.cfg.docker_endpoint, timeout=120, max_pool_size=self.cfg.size * 2 + 8
        )
        try:
            image = await asyncio.to_thread(self._client.images.get, self.cfg.image)
        except docker.errors.ImageNotFound as exc:
            raise RuntimeError(
                f"sandbox image {self.cfg.image} not found: run `rollstream up --only image`"
            ) from exc
        self.image_digest = str(image.id)
        await asyncio.to_thread(reaper.reap_orphans, self._client)
        slots = await asyncio.gather(
            *(asyncio.to_thread(self._create) for _ in range(self.cfg.size))
        )
        for slot in slots:
            self._idle.put_nowait(slot)

    def _used_uids(self) -> set[int]:
        used = set()
        for c in self._client.containers.list(filters={"label": reaper.UID_LABEL}):
            with contextlib.suppress(ValueError):
                used.add(int((c.labels or {}).get(reaper.UID_LABEL, "")))
        return used

    def _create(self) -> Slot:
        used = self._used_uids() | self._uids
        uid = random.choice([u for u in random.sample(JOB_UIDS, 64) if u not in used])
        self._uids.add(uid)
        labels = {
            **self.cfg.labels,
            reaper.OWNER_LABEL: reaper.owner_token(),
            reaper.POOL_LABEL: self.pool_id,
            reaper.UID_LABEL: str(uid),
        }
        # by id, not tag: every container runs exactly the image the results name
        kwargs = container_kwargs(self.image_digest, self.cfg.limits, labels, user=SANDBOX_USER)
        container = self._client.containers.run(
            command=["sleep", "infinity"], detach=True, **kwargs
        )
        return Slot(str(container.id), uid)

    async def execute(self, job: dict[str, Any], limit_s: float) -> Execution:
        """Run one executor job on an idle container; never raises for infrastructure
        trouble (it becomes Execution.error)."""
        if self._closed:
            return Execution(None, error="the sandbox pool is closed")
        t0 = time.monotonic()
        try:
            slot = await asyncio.wait_for(self._idle.get(), self.cfg.acquire_timeout_s)
        except TimeoutError:
            return Execution(None, error="no sandbox container became available in time")
        waited = time.monotonic() - t0
        try:
            ex = await asyncio.to_thread(self._run_in, slot, job, limit_s)
        except asyncio.CancelledError:
            self._replace(slot)
            raise
        except Exception as exc:
            ex = Execution(None, error=f"docker: {type(exc).__name__}: {exc}"[:500])
        slot.jobs += 1
        report = ex.report or {}
        reusable = report.get("clean") is True and report.get("outcome") in REUSABLE
        if reusable and slot.jobs < self.cfg.max_jobs_per_container and not self._closed:
            self._idle.put_nowait(slot)
        else:
            self._replace(slot)
        ex.where, ex.waited_s = slot.short, waited
        return ex

    def _run_in(self, slot: Slot, job: dict[str, Any], limit_s: float) -> Execution:
        payload = json.dumps(job, separators=(",", ":")).encode()
        user = f"{slot.uid}:{slot.uid}"
        run = execio.run(
            self._client.api, slot.id, EXECUTOR_ARGV, user, payload, limit_s + self.cfg.exec_grace_s
        )
        started = next((e for e in run.events if e.get("event") == "started"), None)
        result = next((e for e in run.events if e.get("event") == "result"), None)
        ex = Execution(
            result,
            started=started is not None,
            oom_before=(started or {}).get("oom_kill"),
            error=run.error,
            timed_out=run.timed_out,
            killed=run.exit_code is not None and run.exit_code > 128,
        )
        if result is None:
            tail = run.stderr.decode("utf-8", "replace")[-300:]
            ex.error = "; ".join(x for x in (ex.error, f"exit code {run.exit_code}", tail) if x)
            if started is not None and not run.timed_out:
                ex.oom_after = self._probe_oom(slot)
        return ex

    def _probe_oom(self, slot: Slot) -> int | None:
        """The container's OOM-kill count, read by the keeper user (not the job's uid)."""
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

    def _replace(self, slot: Slot) -> None:
        self.replaced += 1
        task = asyncio.get_running_loop().create_task(self._renew(slot))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _renew(self, old: Slot) -> None:
        with contextlib.suppress(Exception):
            await asyncio.to_thread(self._remove, old.id)
        self._uids.discard(old.uid)
        delay = 0.5
        while not self._closed:
            try:
                slot = await asyncio.to_thread(self._create)
            except Exception as exc:
                log.error("cannot create a sandbox container (retrying in %.0fs): %s", delay, exc)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._closing.wait(), delay)
                delay = min(delay * 2, 30.0)
                continue
            if self._closed:
                await asyncio.to_thread(self._remove, slot.id)
            else:
                self._idle.put_nowait(slot)
            return

    def _remove(self, container_id: str) -> None:
        with contextlib.suppress(Exception):
            self._client.api.remove_container(container_id, force=True)

    async def close(self) -> None:
        """Remove every container of this pool (also ones being created right now)."""
        if self._closed:
            return
        self._closed = True
        self._closing.set()
        if self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)
        if self._client is None:
            return
        mine = await asyncio.to_thread(
            self._client.containers.list,
            all=True,
            filters={"label": f"{reaper.POOL_LABEL}={self.pool_id}"},
        )
        await asyncio.gather(*(asyncio.to_thread(self._remove, str(c.id)) for c in mine))
        await asyncio.to_thread(self._client.close)
