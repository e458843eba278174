"""The Redis rollstream starts persists with AOF: a SIGKILL and restart of it loses no
idempotency key of the ingest gateway (a Redis of the test's own, on another port and
state directory; the shared one is never touched)."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
from pathlib import Path

from services.infra import redis_local
from services.ingest.state import IngestState
from services.settings import Settings


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def own_redis(settings: Settings, state_dir: Path) -> Settings:
    port = free_port()
    return settings.model_copy(
        update={
            "redis": settings.redis.model_copy(update={"port": port, "url": None}),
            "stack": settings.stack.model_copy(update={"state_dir": state_dir}),
        }
    )


async def _claim_all(url: str, ids: list[str]) -> None:
    state = IngestState.from_url(url, "persist", 3600, 60)
    try:
        for cid in ids:
            await state.claim("trace", cid, {"trajectory_id": f"t-{cid}", "done": False})
            await state.done("trace", cid, {"trajectory_id": f"t-{cid}"})
    finally:
        await state.aclose()


async def _records(url: str, ids: list[str]) -> dict[str, dict[str, object] | None]:
    state = IngestState.from_url(url, "persist", 3600, 60)
    try:
        return {cid: await state.record("trace", cid) for cid in ids}
    finally:
        await state.aclose()


def test_redis_sigkill_and_restart_loses_no_idempotency_key(
    settings: Settings, tmp_path: Path, _stack_up: None
) -> None:
    run = own_redis(settings, tmp_path)
    assert redis_local.up(run).healthy
    proc = redis_local.process(run)
    try:
        ids = [f"client-{i}" for i in range(500)]
        asyncio.run(_claim_all(run.redis.endpoint, ids))
        pid = proc.pid()
        assert pid is not None
        os.killpg(pid, signal.SIGKILL)  # no shutdown, no final save: only the AOF is left
        for _ in range(100):
            if proc.pid() is None:
                break
            asyncio.run(asyncio.sleep(0.05))
        assert proc.pid() is None
        assert list((tmp_path / "redis" / "data").rglob("*.aof")), "no append-only file"
        assert redis_local.up(run).healthy
        found = asyncio.run(_records(run.redis.endpoint, ids))
        lost = [cid for cid, rec in found.items() if rec is None or not rec.get("done")]
        assert lost == [], f"{len(lost)} idempotency keys lost: {lost[:5]}"
    finally:
        proc.stop()
