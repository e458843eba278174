"""Claim check and dead letters against in-memory doubles and a real directory store."""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

import msgspec
import pytest

from schemas import arrays, codec
from schemas.claimcheck import ClaimCheck, DirBlobStore
from schemas.codec import SchemaError
from schemas.deadletter import publish_dead_letter
from schemas.messages import BlobRef, DeadLetter, Task, Trajectory, VerifierSpec


class MemoryStore:
    kind = "memory"

    def __init__(self) -> None:
        self.blobs: dict[str, bytes] = {}
        self.ttls: dict[str, float | None] = {}

    async def put(self, key: str, data: bytes, ttl_s: float | None) -> None:
        self.blobs[key], self.ttls[key] = data, ttl_s

    async def get(self, key: str) -> bytes | None:
        return self.blobs.get(key)

    async def aclose(self) -> None:
        return None


def big_trajectory(tokens: int) -> Trajectory:
    ids = [int.from_bytes(os.urandom(2), "little") for _ in range(tokens)]
    return Trajectory(
        task_id="t1",
        group_id="g1",
        group_size=2,
        verifier=VerifierSpec(name="exact", answer="4"),
        completion_tokens=arrays.pack_i32(ids),
        behaviour_logprobs=arrays.pack_f32([-0.5] * tokens),
        policy_versions=arrays.pack_i32([3] * tokens),
    )


async def test_small_messages_travel_inline() -> None:
    store = MemoryStore()
    cc = ClaimCheck(store, inline_limit=4096)
    traj = big_trajectory(10)
    data = await cc.pack(traj)
    assert data == codec.encode(traj) and not store.blobs
    assert await cc.unpack(data, Trajectory) == traj


async def test_large_messages_go_to_the_store_with_their_envelope() -> None:
    store = MemoryStore()
    cc = ClaimCheck(store, inline_limit=4096, ttl_s=60)
    traj = big_trajectory(2000)
    data = await cc.pack(traj)
    ref = codec.decode(data, BlobRef)
    encoded = codec.encode(traj)
    assert len(data) < 1024 and ref.size == len(encoded)
    assert ref.sha256 == hashlib.sha256(encoded).hexdigest() == ref.key
    assert (ref.id, ref.created_at, ref.origin, ref.inner_schema) == (
        traj.id,
        traj.created_at,
        traj.origin,
        "Trajectory",
    )
    assert store.blobs[ref.key] == encoded and store.ttls[ref.key] == 60
    assert await cc.unpack(data, Trajectory) == traj
    assert await cc.unpack(data) == traj
    assert await cc.unpack(data, BlobRef) == ref  # asked for the reference itself


async def test_tampered_missing_and_mismatched_blobs_are_schema_errors() -> None:
    store = MemoryStore()
    cc = ClaimCheck(store, inline_limit=4096)
    data = await cc.pack(big_trajectory(2000))
    ref = codec.decode(data, BlobRef)
    good = store.blobs[ref.key]

    store.blobs[ref.key] = good[:-1] + bytes([good[-1] ^ 1])
    err = await _unpack_error(cc, data)
    assert err.what == "Trajectory" and "sha256" in err.why and "tampered" in err.why
    store.blobs[ref.key] = good + b"\x00"
    assert "size" in (await _unpack_error(cc, data)).why
    del store.blobs[ref.key]
    assert "missing (expired or never stored)" in (await _unpack_error(cc, data)).why
    store.blobs[ref.key] = good
    err = await _unpack_error(cc, data, Task)
    assert err.why == "expected Task, the reference holds Trajectory"


async def test_forged_references_are_refused() -> None:
    store = MemoryStore()
    cc = ClaimCheck(store, inline_limit=4096)
    data = await cc.pack(big_trajectory(2000))
    ref = codec.decode(data, BlobRef)
    for change, why in [
        ({"store": "dir"}, "blob is in a 'dir' store; this reader uses 'memory'"),
        ({"key": "../../etc/passwd"}, "invalid blob key"),
        ({"id": "someone-else"}, "blob holds Trajectory"),
        ({"size": codec.MAX_MESSAGE_BYTES + 1}, "exceeds the codec cap"),
    ]:
        forged = codec.encode(msgspec.structs.replace(ref, **change))
        assert why in (await _unpack_error(cc, forged)).why


async def test_garbage_record_is_a_schema_error() -> None:
    cc = ClaimCheck(MemoryStore())
    assert (await _unpack_error(cc, b"\xc1")).what == "bytes"


async def _unpack_error(
    cc: ClaimCheck, data: bytes, expected: type[Task] | None = None
) -> SchemaError:
    with pytest.raises(SchemaError) as info:
        await cc.unpack(data, expected)
    return info.value


def files_under(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file()]


async def test_dir_store_is_atomic_content_addressed_and_expires(tmp_path: Path) -> None:
    store = DirBlobStore(tmp_path, ttl_s=3600)
    cc = ClaimCheck(store, inline_limit=4096)
    traj = big_trajectory(3000)
    data = await cc.pack(traj)
    ref = codec.decode(data, BlobRef)
    files = files_under(tmp_path)
    assert files == [store.path(ref.key)]  # no temporary file left behind
    assert await cc.unpack(data, Trajectory) == traj

    store.path(ref.key).write_bytes(b"tampered")
    assert "tampered" in (await _unpack_error(cc, data)).why

    await store.put("old-blob", b"x", ttl_s=3600)
    await store.put("new-blob", b"y", ttl_s=3600)
    two_hours_ago = time.time() - 7200
    os.utime(store.path("old-blob"), (two_hours_ago, two_hours_ago))
    assert await store.get("old-blob") is None
    assert await store.get("new-blob") == b"y"
    assert await store.sweep() == 1
    assert not store.path("old-blob").exists() and store.path("new-blob").exists()
    with pytest.raises(ValueError, match="invalid blob key"):
        await store.put("../escape", b"z", None)


class RecordingProducer:
    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes | None, bytes | None]] = []

    async def send_and_wait(
        self, topic: str, value: bytes | None = None, key: bytes | None = None
    ) -> object:
        self.sent.append((topic, value, key))
        return None


async def test_dead_letter_keeps_the_original_and_the_source_key() -> None:
    producer = RecordingProducer()
    original = b"\x81\xa6schema\xa6Rocket"
    try:
        codec.decode(original)
    except SchemaError as exc:
        letter = await publish_dead_letter(
            producer,
            "p.dlq",
            reason=f"undecodable: {exc}",
            source_topic="p.trajectories",
            partition=3,
            offset=42,
            key=b"g7",
            value=original,
            consumer="dispatcher-0",
            error=exc,
        )
    [(topic, value, key)] = producer.sent
    assert (topic, key) == ("p.dlq", b"g7")
    assert value is not None and codec.decode(value, DeadLetter) == letter
    assert letter.original == original and not letter.truncated
    assert letter.error_type == "SchemaError" and "unknown schema" in letter.detail
    assert (letter.source_topic, letter.source_partition, letter.source_offset) == (
        "p.trajectories",
        3,
        42,
    )
    assert letter.original_sha256 == hashlib.sha256(original).hexdigest()


async def test_dead_letter_size_handling() -> None:
    producer = RecordingProducer()
    huge = os.urandom(20_000)
    common = {
        "reason": "too big",
        "source_topic": "p.tasks",
        "partition": 0,
        "offset": 1,
        "key": None,
        "value": huge,
        "consumer": "feeder",
    }
    cut = await publish_dead_letter(producer, "p.dlq", **common, max_original_bytes=1000)  # type: ignore[arg-type]
    assert cut.truncated and cut.original == huge[:1000] and cut.original_size == 20_000

    store = MemoryStore()
    whole = await publish_dead_letter(
        producer,
        "p.dlq",
        **common,
        claim_check=ClaimCheck(store, inline_limit=4096),  # type: ignore[arg-type]
    )
    assert not whole.truncated and whole.original == huge
    value = producer.sent[-1][1]
    assert value is not None and codec.decode(value, BlobRef).inner_schema == "DeadLetter"
    with pytest.raises(ValueError, match="reason"):
        await publish_dead_letter(producer, "p.dlq", **(common | {"reason": " "}))  # type: ignore[arg-type]
