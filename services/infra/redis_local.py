"""Redis for the local stack: the one that answers, else Debian's redis-server on 127.0.0.1.

The Redis started here persists with an append-only file (`appendonly yes`, `appendfsync
everysec`) in `{state_dir}/redis/data`: a SIGKILL or restart of Redis loses at most the
last second of writes; losing the data directory loses everything (README: "What survives
what"). A Redis that already answers is reused as it is configured.
"""

from __future__ import annotations

import time
from pathlib import Path

from services.infra.common import Check, StackError, ensure_debian_packages, which
from services.infra.procs import ManagedProcess
from services.settings import Settings


def process(settings: Settings) -> ManagedProcess:
    return ManagedProcess("redis", settings.stack.state_dir)


def probe(settings: Settings, timeout_s: float = 2.0) -> Check:
    import redis

    r = settings.redis
    check = Check(
        "redis", False, r.endpoint, managed=r.managed and process(settings).pid() is not None
    )
    try:
        client = redis.Redis.from_url(
            r.endpoint, socket_timeout=timeout_s, socket_connect_timeout=timeout_s
        )
        try:
            client.ping()
            info = client.info("server")
        finally:
            client.close()
    except Exception as exc:
        check.detail = f"not answering at {r.endpoint}: {type(exc).__name__}: {exc}"
        if r.managed:
            check.fix = f"run `rollstream up`; if it fails, read {process(settings).log_file}"
        else:
            check.fix = f"check the configured redis.url={r.url}"
        return check
    check.healthy = True
    check.version = str(info.get("redis_version", ""))
    check.detail = f"mode {info.get('redis_mode', '?')}"
    return check


def server_args(port: int, data: Path) -> list[str]:
    """redis-server's arguments: 127.0.0.1 only, AOF persistence (fsync every second) in
    `data`, no RDB snapshots."""
    return [
        "--bind", "127.0.0.1", "--port", str(port), "--protected-mode", "yes",
        "--daemonize", "no", "--dir", str(data), "--save", "",
        "--appendonly", "yes", "--appendfsync", "everysec",
    ]  # fmt: skip


def up(settings: Settings) -> Check:
    current = probe(settings)
    if current.healthy or not settings.redis.managed:
        current.detail = ("reused: " if current.healthy else "") + current.detail
        return current
    ensure_debian_packages({"redis-server": "redis-server"})
    proc = process(settings)
    if proc.pid() is None:
        data = proc.dir / "data"
        data.mkdir(parents=True, exist_ok=True)
        binary = which("redis-server") or "redis-server"
        proc.start([binary, *server_args(settings.redis.port, data)])
    for _ in range(100):
        if proc.pid() is None:
            raise StackError(
                f"redis-server exited at start; read {proc.log_file}:\n{proc.log_tail()}"
            )
        check = probe(settings, timeout_s=0.5)
        if check.healthy:
            check.managed = True
            check.detail = "started: " + check.detail
            return check
        time.sleep(0.1)
    raise StackError(f"redis-server did not answer within 10s; read {proc.log_file}")
