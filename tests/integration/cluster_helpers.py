"""A local 3-node KRaft cluster of a test's own: its own state dir and ports, so it never
disturbs the single-node stack that `make test` uses (tests/e2e/test_stack_lifecycle.py
does the same for one node)."""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from services.settings import Settings, load

ROOT = Path(__file__).resolve().parents[2]
BROKERS = 3
STEP = 2
"""Node i listens on base + 2(i-1) (clients) and base + 2(i-1) + 1 (controller)."""


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port_base(attempts: int = 40) -> int:
    """A base port with the 2N ports of the cluster free; skips the test if none is."""
    rng = random.Random()
    for _ in range(attempts):
        base = rng.randrange(20000, 60000, 2)
        if all(_free(base + i) for i in range(2 * BROKERS)):
            return base
    pytest.skip(f"no {2 * BROKERS} consecutive free ports for a local {BROKERS}-node cluster")


def cluster_pairs(state_dir: Path, prefix: str, base: int) -> dict[str, str]:
    """Settings of the test's cluster (section.key -> value)."""
    return {
        "stack.state_dir": str(state_dir),
        "kafka.brokers": str(BROKERS),
        "kafka.port": str(base),
        "kafka.controller_port": str(base + 1),
        "kafka.node_port_step": str(STEP),
        "kafka.heap": "384m",
        "kafka.start_timeout_s": "150",
        "topics.prefix": prefix,
    }


def cluster_env(pairs: dict[str, str], **more: str) -> dict[str, str]:
    """The environment of a `rollstream` child that uses the test's cluster, the machine's
    Redis and Docker engine as configured endpoints (so `down` leaves them alone)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ROLLSTREAM")}
    values = {
        **pairs,
        "redis.url": "redis://127.0.0.1:6379/0",
        "docker.host": "unix:///var/run/docker.sock",
        **more,
    }
    for key, value in values.items():
        section, _, name = key.partition(".")
        env[f"ROLLSTREAM__{section.upper()}__{name.upper()}"] = value
    env["PYTHONPATH"] = str(ROOT)
    return env


def cluster_settings(pairs: dict[str, str]) -> Settings:
    return load([f"{k}={v}" for k, v in pairs.items()])


def rollstream(
    env: dict[str, str], *args: str, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "services.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
    )


def node_pid(state_dir: Path, node: int) -> int | None:
    from services.infra.procs import ManagedProcess

    return ManagedProcess(f"kafka-{node}", state_dir).pid()


def kill_node(state_dir: Path, node: int) -> int:
    """SIGKILL one broker (its process group); return its pid once it is gone."""
    pid = node_pid(state_dir, node)
    assert pid is not None, f"kafka-{node} is not running"
    os.killpg(pid, signal.SIGKILL)
    deadline = time.monotonic() + 20
    while node_pid(state_dir, node) is not None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert node_pid(state_dir, node) is None
    return pid


def our_processes(state_dir: Path) -> list[str]:
    """Command lines of live processes that mention the state dir (the brokers' JVMs)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if str(state_dir) in cmd and state != "Z":
            found.append(cmd)
    return found


def down_and_check(env: dict[str, str], state_dir: Path) -> None:
    """`rollstream down`, then no JVM of the cluster is left. `down` removes every
    rollstream.sandbox container of the engine it is given, other runs' too: it is given
    no engine here, so the shared machine's sandboxes are left alone."""
    quiet = {**env, "ROLLSTREAM__DOCKER__HOST": "unix:///nonexistent/docker.sock"}
    out = rollstream(quiet, "down", timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    for node in range(1, BROKERS + 1):
        assert f"kafka-{node}: " in out.stdout, out.stdout
    deadline = time.monotonic() + 40
    while our_processes(state_dir) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert our_processes(state_dir) == []


def up_json(env: dict[str, str], only: str) -> list[dict[str, object]]:
    out = rollstream(env, "up", "--brokers", str(BROKERS), "--only", only, "--json")
    assert out.returncode == 0, out.stdout + out.stderr
    checks: list[dict[str, object]] = json.loads(out.stdout)
    return checks


async def topic_layout(settings: Settings) -> dict[str, tuple[int, str | None]]:
    """Topic name -> (replicas of every partition, all equal; min.insync.replicas), through
    the admin API, for the run's topics."""
    from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

    from services.kafka import admin

    client = admin(settings)
    await client.start()
    try:
        names = [t for t in await client.list_topics() if t.startswith(settings.topics.prefix)]
        layout: dict[str, tuple[int, str | None]] = {}
        for meta in await client.describe_topics(names):
            counts = {len(p["replicas"]) for p in meta["partitions"]}
            assert len(counts) == 1, meta
            layout[meta["topic"]] = (counts.pop(), None)
        resources = [ConfigResource(ConfigResourceType.TOPIC, n) for n in names]
        for response in await client.describe_configs(resources):
            for _err, _msg, _type, name, entries in response.resources:
                values = {e[0]: str(e[1]) for e in entries}
                layout[name] = (layout[name][0], values.get("min.insync.replicas"))
        return layout
    finally:
        await client.close()


async def broker_ids(settings: Settings) -> list[int]:
    from services.kafka import admin

    client = admin(settings)
    await client.start()
    try:
        info = await client.describe_cluster()
    finally:
        await client.close()
    return sorted(int(b["node_id"]) for b in info["brokers"])
