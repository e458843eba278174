"""Claim check and dead letters on the real stack: Kafka at the configured bootstrap,
Redis, and a directory store. Each test uses its own topic prefix and Redis key prefix."""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from schemas import arrays, codec, topics
from schemas.claimcheck import BlobStore, ClaimCheck, DirBlobStore, RedisBlobStore
from schemas.codec import SchemaError
from schemas.deadletter import publish_dead_letter
from schemas.messages import BlobRef, ChatMessage, DeadLetter, Trajectory, VerifierSpec
from services import blobs
from services import topics as topic_admin
from services.settings import Settings

FIVE_MB = 5 * 1024 * 1024


@pytest.fixture(scope="module")
def _stack_up(settings: Settings) -> None:
    """Kafka and Redis only (these tests need neither Docker nor the sandbox image)."""
    from services.infra import stack

    needed = ("kafka", "redis")
    down = [c for c in stack.doctor(settings) if c.component in needed and not c.healthy]
    if down:
        lines = "\n".join(f"  {c.component}: {c.detail} ({c.fix})" for c in down)
        pytest.fail(f"Kafka or Redis is down; run `make up` (or `rollstream up`):\n{lines}")


def run_settings(settings: Settings, prefix: str) -> Settings:
    return settings.model_copy(
        update={"topics": settings.topics.model_copy(update={"prefix": prefix})}
    )


def five_mb_trajectory() -> Trajectory:
    """Over 5 MiB encoded: 450k completion tokens with logprobs and versions, random."""
    n = 450_000
    ids = arrays.unpack_i32(os.urandom(4 * n))
    return Trajectory(
        task_id="big-task",
        group_id=f"g-{uuid.uuid4().hex[:8]}",
        group_size=8,
        index=3,
        messages=[ChatMessage(role="user", content="write a long program " * 1000)],
        prompt_tokens=arrays.pack_i32(range(1000)),
        completion_tokens=arrays.pack_i32(ids),
        behaviour_logprobs=arrays.pack_f32([-(i % 97) / 10 for i in range(n)]),
        policy_versions=arrays.pack_i32([7] * n),
        policy_version=7,
        generator_id="gen-0",
        verifier=VerifierSpec(name="python_tests", tests="def test_x():\n    assert True\n"),
        completion="x" * 10_000,
        turns=1,
    )


@pytest.fixture(params=["redis", "dir"])
async def store(
    request: pytest.FixtureRequest, settings: Settings, tmp_path: Path, _stack_up: None
) -> AsyncIterator[BlobStore]:
    if request.param == "dir":
        yield DirBlobStore(tmp_path / "blobs", ttl_s=600)
        return
    prefix = f"rollstream:test:{uuid.uuid4().hex}:blob:"
    redis_store = RedisBlobStore(settings.redis.endpoint, prefix=prefix)
    try:
        yield redis_store
    finally:
        keys = [k async for k in redis_store.client.scan_iter(match=prefix + "*", count=100)]
        if keys:
            await redis_store.client.delete(*keys)
        await redis_store.aclose()


async def produce(settings: Settings, topic: str, key: bytes | None, value: bytes) -> None:
    from aiokafka import AIOKafkaProducer

    producer = AIOKafkaProducer(
        bootstrap_servers=settings.kafka.endpoint, acks="all", enable_idempotence=True
    )
    await producer.start()
    try:
        await producer.send_and_wait(topic, value, key=key)
    finally:
        await producer.stop()


async def consume_one(settings: Settings, topic: str, group: str) -> tuple[bytes | None, bytes]:
    from aiokafka import AIOKafkaConsumer

    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=settings.kafka.endpoint,
        group_id=group,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
    )
    await consumer.start()
    try:
        async with asyncio.timeout(30):
            while True:
                batch = await consumer.getmany(timeout_ms=500)
                for records in batch.values():
                    for record in records:
                        assert record.value is not None
                        return record.key, record.value
    finally:
        await consumer.stop()


async def test_five_mb_trajectory_through_kafka_via_claim_check(
    settings: Settings, prefix: str, store: BlobStore
) -> None:
    run = run_settings(settings, prefix)
    await topic_admin.ensure(run)
    cc = ClaimCheck(store, inline_limit=run.blobs.inline_limit_bytes, ttl_s=600)
    traj = five_mb_trajectory()
    original = codec.encode(traj)
    assert len(original) > FIVE_MB

    value = await cc.pack(traj)
    key = topics.key_for(topics.TRAJECTORIES, traj)
    assert len(value) < 1024  # the record carries the reference only
    name = topics.TRAJECTORIES.full_name(prefix)
    await produce(run, name, key, value)

    got_key, got_value = await consume_one(run, name, f"{prefix}-reader")
    assert got_key == traj.group_id.encode()
    assert codec.decode(got_value, BlobRef).size == len(original)
    back = await cc.unpack(got_value, Trajectory)
    assert codec.encode(back) == original  # byte-identical
    assert back == traj


async def test_tampered_blob_is_detected(settings: Settings, store: BlobStore) -> None:
    cc = ClaimCheck(store, inline_limit=settings.blobs.inline_limit_bytes, ttl_s=600)
    traj = five_mb_trajectory()
    value = await cc.pack(traj)
    ref = codec.decode(value, BlobRef)
    blob = await store.get(ref.key)
    assert blob is not None
    flipped = bytearray(blob)
    flipped[len(blob) // 2] ^= 0x01  # one bit in the middle of the packed tokens
    await store.put(ref.key, bytes(flipped), 600)
    with pytest.raises(SchemaError) as info:
        await cc.unpack(value, Trajectory)
    assert info.value.what == "Trajectory" and "sha256" in info.value.why


async def test_expired_redis_blob_reads_as_missing(settings: Settings, _stack_up: None) -> None:
    prefix = f"rollstream:test:{uuid.uuid4().hex}:blob:"
    store = RedisBlobStore(settings.redis.endpoint, prefix=prefix)
    try:
        cc = ClaimCheck(store, inline_limit=4096, ttl_s=600)
        value = await cc.pack(five_mb_trajectory())
        ref = codec.decode(value, BlobRef)
        assert 0 < await store.client.ttl(prefix + ref.key) <= 600
        await store.client.delete(prefix + ref.key)  # what expiry does
        with pytest.raises(SchemaError, match="missing"):
            await cc.unpack(value)
    finally:
        await store.aclose()


async def test_claim_check_from_settings(settings: Settings, tmp_path: Path) -> None:
    redis_cc = blobs.from_settings(settings)
    assert isinstance(redis_cc.store, RedisBlobStore)
    assert redis_cc.inline_limit == settings.blobs.inline_limit_bytes
    await redis_cc.aclose()
    update = {"backend": "dir", "dir": tmp_path}
    dir_settings = settings.model_copy(update={"blobs": settings.blobs.model_copy(update=update)})
    dir_cc = blobs.from_settings(dir_settings)
    assert isinstance(dir_cc.store, DirBlobStore) and dir_cc.store.root == tmp_path
    assert dir_cc.store.ttl_s == settings.blobs.ttl_s


async def test_dead_letter_through_kafka(settings: Settings, prefix: str, _stack_up: None) -> None:
    from aiokafka import AIOKafkaProducer

    run = run_settings(settings, prefix)
    await topic_admin.ensure(run)
    bad = b"\x82\xa6schema\xaaTrajectory\xa8group_id\x07"  # group_id is not a string
    producer = AIOKafkaProducer(bootstrap_servers=run.kafka.endpoint, acks="all")
    await producer.start()
    try:
        try:
            codec.decode(bad, Trajectory)
        except SchemaError as exc:
            letter = await publish_dead_letter(
                producer,
                topics.DLQ.full_name(prefix),
                reason=f"undecodable trajectory: {exc}",
                source_topic=topics.TRAJECTORIES.full_name(prefix),
                partition=1,
                offset=17,
                key=b"g-bad",
                value=bad,
                consumer="dispatcher-test",
                error=exc,
            )
    finally:
        await producer.stop()
    key, value = await consume_one(run, topics.DLQ.full_name(prefix), f"{prefix}-ops")
    assert key == b"g-bad"
    got = codec.decode(value, DeadLetter)
    assert got == letter and got.original == bad
    assert "Trajectory at $.group_id" in got.reason and got.error_type == "SchemaError"
