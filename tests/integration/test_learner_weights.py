"""The Redis weight store against the local Redis: chunks, manifest last, integrity."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
import torch

from learner.weights import RedisWeightStore, WeightIntegrityError, fetch
from services.settings import Settings


@pytest.fixture
def store(settings: Settings) -> Iterator[RedisWeightStore]:
    from services.infra import redis_local

    check = redis_local.probe(settings)
    if not check.healthy:
        pytest.fail(f"Redis is not up ({check.detail}); run `rollstream up`")
    namespace = f"rollstream:test-{uuid.uuid4().hex[:8]}:weights"
    s = RedisWeightStore.from_url(settings.redis.endpoint, "pi", namespace=namespace,
                                  chunk_bytes=64 * 1024, keep=2)  # fmt: skip
    yield s
    keys = list(s.r.scan_iter(f"{namespace}:*"))
    if keys:
        s.r.delete(*keys)
    s.r.close()


def _state(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"a": torch.randn(300, 200, generator=g), "b": torch.arange(7, dtype=torch.int64)}


def test_chunked_round_trip(store: RedisWeightStore, settings: Settings) -> None:
    state = _state(0)
    ref = store.put(1, state)
    assert ref.uri.startswith("redis:") and ref.size_bytes > 240_000
    chunks = [k for k in store.r.scan_iter(ref.uri.removeprefix("redis:") + ":*")]
    assert len(chunks) == -(-ref.size_bytes // (64 * 1024)) + 1  # chunks + the manifest
    got = fetch(ref.uri, ref.sha256, redis_url=settings.redis.endpoint)
    assert all(torch.equal(got[k], state[k]) for k in state)


def test_integrity_errors(store: RedisWeightStore) -> None:
    ref = store.put(1, _state(0))
    base = ref.uri.removeprefix("redis:")
    with pytest.raises(WeightIntegrityError, match="does not match"):
        store.get(ref.uri, "f" * 64)
    store.r.set(f"{base}:1", b"x" * 65536)  # a corrupted chunk
    with pytest.raises(WeightIntegrityError):
        store.get(ref.uri, ref.sha256)
    store.r.delete(f"{base}:manifest")  # as a reader sees a blob still being written
    with pytest.raises(WeightIntegrityError, match="no manifest"):
        store.get(ref.uri, ref.sha256)


def test_keeps_the_newest_blobs(store: RedisWeightStore) -> None:
    refs = [store.put(v, _state(v)) for v in range(4)]
    for old in refs[:2]:
        with pytest.raises(WeightIntegrityError):
            store.get(old.uri, old.sha256)
        assert not list(store.r.scan_iter(old.uri.removeprefix("redis:") + ":*"))
    for ref in refs[2:]:
        assert store.get(ref.uri, ref.sha256)
