"""The three services and the image, used for real."""

from __future__ import annotations

import asyncio
import json
import uuid

import pytest

from services import topics
from services.infra import image
from services.settings import Settings


async def test_kafka_round_trip_on_declared_topic(
    settings: Settings, prefix: str, _stack_up: None
) -> None:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

    run = settings.model_copy(
        update={"topics": settings.topics.model_copy(update={"prefix": prefix})}
    )
    states = await topics.ensure(run)
    assert all(s.exists and not s.problems() for s in states)
    name = f"{prefix}.tasks"
    producer = AIOKafkaProducer(
        bootstrap_servers=settings.kafka.endpoint, acks="all", enable_idempotence=True
    )
    await producer.start()
    try:
        sent = [f"msg-{i}".encode() for i in range(20)]
        for i, value in enumerate(sent):
            await producer.send_and_wait(name, value, key=f"task-{i}".encode())
    finally:
        await producer.stop()
    consumer = AIOKafkaConsumer(
        name,
        bootstrap_servers=settings.kafka.endpoint,
        group_id=f"{prefix}-g",
        auto_offset_reset="earliest",
        enable_auto_commit=False,
    )
    await consumer.start()
    got: list[bytes] = []
    try:
        async with asyncio.timeout(30):
            while len(got) < len(sent):
                batch = await consumer.getmany(timeout_ms=500)
                got += [m.value for msgs in batch.values() for m in msgs if m.value is not None]
    finally:
        await consumer.stop()
    assert sorted(got) == sorted(sent)


async def test_topics_ensure_is_idempotent(
    settings: Settings, prefix: str, _stack_up: None
) -> None:
    run = settings.model_copy(
        update={"topics": settings.topics.model_copy(update={"prefix": prefix})}
    )
    first = await topics.ensure(run)
    second = await topics.ensure(run)
    assert [(s.name, s.partitions) for s in first] == [(s.name, s.partitions) for s in second]
    weights = next(s for s in second if s.spec.name == "weights")
    assert weights.configs["cleanup.policy"] == "compact"
    trajectories = next(s for s in second if s.spec.name == "trajectories")
    assert trajectories.partitions == settings.topics.partitions


def test_redis_round_trip(settings: Settings, _stack_up: None) -> None:
    import redis

    client = redis.Redis.from_url(settings.redis.endpoint)
    key = f"rollstream:test:{uuid.uuid4().hex}"
    try:
        assert client.set(key, b"\x00payload\xff", nx=True, ex=30)
        assert not client.set(key, b"other", nx=True, ex=30)  # SET NX: the idempotency primitive
        assert client.get(key) == b"\x00payload\xff"
        assert 0 < client.ttl(key) <= 30
    finally:
        client.delete(key)
        client.close()


HARDENING_PROBE = r"""
import json, os, socket
out = {"uid": os.getuid(), "gid": os.getgid()}
status = dict(l.split(":", 1) for l in open("/proc/self/status").read().splitlines())
out["cap_eff"] = status["CapEff"].strip()
out["no_new_privs"] = status["NoNewPrivs"].strip()
try:
    open("/usr/evil", "w"); out["root_writable"] = True
except OSError:
    out["root_writable"] = False
open("/work/scratch.txt", "w").write("ok"); out["scratch_ok"] = True
try:
    socket.create_connection(("127.0.0.1", 9092), timeout=2); out["net"] = "connected"
except OSError as e:
    out["net"] = type(e).__name__
out["ifaces"] = sorted(os.listdir("/sys/class/net"))
out["answer"] = sum(i * i for i in range(1000))
print(json.dumps(out))
"""


def test_hardened_container_runs_python(settings: Settings, docker_client) -> None:  # type: ignore[no-untyped-def]
    from sandbox_workers.hardening import Limits, container_kwargs

    kwargs = container_kwargs(image.image_ref(settings), Limits(), labels={"rollstream.test": "1"})
    container = docker_client.containers.run(
        command=["python3", "-c", HARDENING_PROBE], detach=True, **kwargs
    )
    try:
        assert container.wait(timeout=60)["StatusCode"] == 0, container.logs().decode()
        report = json.loads(container.logs(stdout=True, stderr=False).decode())
        attrs = docker_client.api.inspect_container(container.id)
    finally:
        container.remove(force=True)
    assert report["uid"] == 10001 and report["gid"] == 10001
    assert int(report["cap_eff"], 16) == 0
    assert report["no_new_privs"] == "1"
    assert report["root_writable"] is False and report["scratch_ok"] is True
    assert report["net"] != "connected" and report["ifaces"] == ["lo"]
    assert report["answer"] == sum(i * i for i in range(1000))
    host = attrs["HostConfig"]
    assert host["NetworkMode"] == "none" and host["ReadonlyRootfs"] is True
    assert host["CapDrop"] == ["ALL"] and host["Memory"] == host["MemorySwap"] > 0
    assert host["PidsLimit"] == Limits().pids and host["Init"] is True


@pytest.mark.parametrize("component", ["kafka", "redis", "docker", "image"])
def test_doctor_reports_healthy(settings: Settings, component: str, _stack_up: None) -> None:
    from services.infra import stack

    check = next(c for c in stack.doctor(settings) if c.component == component)
    assert check.healthy, check
    assert check.endpoint and check.version
