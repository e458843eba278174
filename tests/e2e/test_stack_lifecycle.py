"""`rollstream up` / `doctor` / `down` as a user runs them, on a stack of the test's own.

The test's stack has its own state dir and ports, so it never disturbs the stack that
`make test` runs; it reuses the machine's Docker engine as a configured endpoint, which
also proves that `down` leaves alone what it did not start.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from services.infra.procs import ManagedProcess


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def stack_env(tmp_path: Path, prefix: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ROLLSTREAM")}
    env.update(
        {
            "ROLLSTREAM__STACK__STATE_DIR": str(tmp_path / "state"),
            "ROLLSTREAM__KAFKA__PORT": str(_free_port()),
            "ROLLSTREAM__KAFKA__CONTROLLER_PORT": str(_free_port()),
            "ROLLSTREAM__REDIS__PORT": str(_free_port()),
            "ROLLSTREAM__DOCKER__HOST": "unix:///var/run/docker.sock",
            "ROLLSTREAM__TOPICS__PREFIX": prefix,
        }
    )
    return env


def rollstream(
    env: dict[str, str], *args: str, timeout: float = 240
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "services.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=Path(__file__).resolve().parents[2],
    )


def _our_processes(state_dir: Path) -> list[str]:
    """Command lines of live processes that mention the test's state dir."""
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


def test_up_twice_doctor_kill_down(stack_env: dict[str, str], prefix: str) -> None:
    state = Path(stack_env["ROLLSTREAM__STACK__STATE_DIR"])
    try:
        first = rollstream(stack_env, "up", "--json")
        assert first.returncode == 0, first.stdout + first.stderr
        checks = {c["component"]: c for c in json.loads(first.stdout)}
        assert checks["kafka"]["managed"] and checks["kafka"]["detail"].startswith("started")
        assert checks["redis"]["managed"] and checks["redis"]["detail"].startswith("started")
        assert not checks["docker"]["managed"]  # configured endpoint: nothing started for it
        pids = {n: ManagedProcess(n, state).pid() for n in ("kafka", "redis")}
        assert all(pids.values())

        # Second `up` is a no-op: everything reused, same processes.
        second = rollstream(stack_env, "up", "--json")
        assert second.returncode == 0, second.stdout + second.stderr
        for c in json.loads(second.stdout):
            assert c["healthy"] and c["detail"].startswith("reused"), c
        assert {n: ManagedProcess(n, state).pid() for n in ("kafka", "redis")} == pids

        # Topics created by `up` carry messages.
        asyncio.run(
            _round_trip(
                f"127.0.0.1:{stack_env['ROLLSTREAM__KAFKA__PORT']}", f"{prefix}.trajectories"
            )
        )

        doctor = rollstream(stack_env, "doctor", "--json")
        assert doctor.returncode == 0, doctor.stdout + doctor.stderr
        report = json.loads(doctor.stdout)
        components = ["kafka", "redis", "docker", "image", "topics", "model"]
        assert [c["component"] for c in report] == components
        assert all(c["healthy"] for c in report), report

        # Kafka dies: doctor says so in one clear line, with the log and the fix; no traceback.
        os.killpg(pids["kafka"], signal.SIGKILL)
        deadline = time.monotonic() + 20
        while ManagedProcess("kafka", state).pid() is not None and time.monotonic() < deadline:
            time.sleep(0.1)
        sick = rollstream(stack_env, "doctor", "--json", timeout=60)
        assert sick.returncode == 1
        assert "Traceback" not in sick.stdout + sick.stderr
        lines = {c["component"]: c for c in json.loads(sick.stdout)}
        assert not lines["kafka"]["healthy"]
        assert "not answering" in lines["kafka"]["detail"]
        assert "rollstream up" in lines["kafka"]["fix"] and "kafka.log" in lines["kafka"]["fix"]
        assert lines["redis"]["healthy"] and lines["docker"]["healthy"]
        human = rollstream(stack_env, "doctor", timeout=60)
        assert human.returncode == 1 and "DOWN" in human.stdout and "Traceback" not in human.stderr
    finally:
        down = rollstream(stack_env, "down")
    assert down.returncode == 0, down.stdout + down.stderr
    assert "redis: stopped" in down.stdout
    deadline = time.monotonic() + 30
    while _our_processes(state) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _our_processes(state) == []
    # The configured Docker engine was not ours to stop.
    assert rollstream(stack_env, "doctor", "--json", timeout=60).returncode == 1
    assert json.loads(rollstream(stack_env, "doctor", "--json", timeout=60).stdout)[2]["healthy"]


async def _round_trip(bootstrap: str, topic: str) -> None:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    try:
        await producer.send_and_wait(topic, b"hello", key=b"g1")
    finally:
        await producer.stop()
    consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest")
    await consumer.start()
    try:
        async with asyncio.timeout(30):
            msg = await consumer.getone()
    finally:
        await consumer.stop()
    assert (msg.key, msg.value) == (b"g1", b"hello")


def test_help_is_lazy() -> None:
    """`rollstream --help` loads none of the heavy libraries."""
    code = (
        "import sys\n"
        "from services.cli import app\n"
        "try:\n    app(['--help'])\nexcept SystemExit:\n    pass\n"
        "names = ('torch', 'aiokafka', 'docker', 'faust', 'redis', 'pydantic', 'msgspec')\n"
        "heavy = [m for m in names if m in sys.modules]\n"
        "print('HEAVY', heavy)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "HEAVY []" in out.stdout
    assert "up" in out.stdout and "doctor" in out.stdout


def test_schemas_import_no_heavy_libraries() -> None:
    code = (
        "import sys, importlib, pkgutil, schemas\n"
        "for m in pkgutil.walk_packages(schemas.__path__, 'schemas.'):\n"
        "    importlib.import_module(m.name)\n"
        "print([m for m in ('torch', 'aiokafka', 'faust', 'docker') if m in sys.modules])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
