"""Fuzz: random and mutated bytes either decode to a valid message or raise SchemaError,
never another exception, never a hang. Bounded in count (seeded RNG) and in time
(pytest-timeout); the whole file runs in a few seconds."""

from __future__ import annotations

import functools
import random
from collections.abc import Callable, Iterator
from typing import Any

import msgpack
import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from schemas import codec
from schemas.codec import SchemaError
from schemas.messages import Message
from tests.unit.schema_strategies import BY_TYPE

SEED = 20240611
RANDOM_CASES = 3000
MUTATIONS_PER_SEED = 60


def outcome(data: Any) -> str:
    """'ok' (a valid message that re-encodes and decodes equal) or 'error' (SchemaError);
    any other exception fails the test."""
    try:
        msg = codec.decode(data)
    except SchemaError as err:
        assert err.what and err.where and err.why, repr(err)
        return "error"
    assert isinstance(msg, Message)
    assert codec.decode(codec.encode(msg)) == msg
    return "ok"


@functools.cache
def seeds() -> list[bytes]:
    """Valid encodings of every message type (examples drawn once, deterministically)."""
    out = []
    for strategy in BY_TYPE.values():
        for i in range(4):
            out.append(codec.encode(_example(strategy, i)))
    return out


def _example(strategy: st.SearchStrategy[Message], i: int) -> Message:
    found: list[Message] = []

    @settings(
        max_examples=i + 1,
        database=None,
        derandomize=True,
        suppress_health_check=list(HealthCheck),
    )
    @given(strategy)
    def grab(msg: Message) -> None:
        found.append(msg)

    grab()
    return found[-1]


def _flip(rng: random.Random, data: bytes) -> bytes:
    b = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        b[rng.randrange(len(b))] = rng.randrange(256)
    return bytes(b)


def _truncate(rng: random.Random, data: bytes) -> bytes:
    return data[: rng.randrange(len(data))]


def _extend(rng: random.Random, data: bytes) -> bytes:
    return data + rng.randbytes(rng.randint(1, 16))


def _splice(rng: random.Random, data: bytes) -> bytes:
    i, j = sorted(rng.randrange(len(data) + 1) for _ in range(2))
    return data[:i] + rng.randbytes(rng.randint(0, 8)) + data[j:]


def _duplicate(rng: random.Random, data: bytes) -> bytes:
    i, j = sorted(rng.randrange(len(data) + 1) for _ in range(2))
    return data[:j] + data[i:j] + data[j:]


MUTATORS: dict[str, Callable[[random.Random, bytes], bytes]] = {
    "flip": _flip,
    "truncate": _truncate,
    "extend": _extend,
    "splice": _splice,
    "duplicate": _duplicate,
}


@pytest.mark.timeout(60)
def test_random_bytes() -> None:
    rng = random.Random(SEED)
    results = [outcome(rng.randbytes(rng.randint(0, 300))) for _ in range(RANDOM_CASES)]
    assert results.count("error") == RANDOM_CASES  # random bytes are never a message


@pytest.mark.timeout(60)
@pytest.mark.parametrize("mutator", sorted(MUTATORS))
def test_mutated_valid_encodings(mutator: str) -> None:
    rng = random.Random(f"{SEED}-{mutator}")
    mutate = MUTATORS[mutator]
    results = [outcome(mutate(rng, data)) for data in seeds() for _ in range(MUTATIONS_PER_SEED)]
    assert len(results) == len(BY_TYPE) * 4 * MUTATIONS_PER_SEED
    if mutator in ("truncate", "extend"):  # a cut or padded message is never valid
        assert set(results) == {"error"}
    else:
        assert results.count("error") > len(results) // 4


def _crafted() -> Iterator[tuple[str, Any]]:
    """Hand-made hostile inputs: wrong versions, missing fields, oversized values."""
    for data in seeds()[::4]:
        raw = msgpack.unpackb(data)
        for version in (0, -1, 2, 2**63, 2**64 - 1, "1", True, None, 1.0, [1]):
            yield "version", msgpack.packb(raw | {"v": version})
        for key in _required(raw["schema"]):
            yield "missing", msgpack.packb({k: v for k, v in raw.items() if k != key})
        for key in raw:
            for wrong in (2**64 - 1, -(2**63), 1e308, "x" * 300, b"\x00" * 64, [None], {"a": 1}):
                yield "wrong type", msgpack.packb(raw | {key: wrong})
    yield "huge str header", b"\x81\xa6schema\xdb\xff\xff\xff\xff"
    yield "huge array header", b"\xdd\xff\xff\xff\xff"
    yield "huge map header", b"\xdf\xff\xff\xff\xff"
    yield "huge bin header", b"\x82\xa6schema\xa4Task\xa2id\xc6\xff\xff\xff\xff"
    yield "over the cap", b"\x00" * (codec.MAX_MESSAGE_BYTES + 1)
    yield "deep nesting", b"\x91" * 100_000
    yield "ext type", b"\xd4\x05\x00"
    yield "timestamp", msgpack.packb({"schema": "Task", "created_at": msgpack.Timestamp(1, 0)})
    yield "int map keys", msgpack.packb({"schema": "Task", 1: 2}, strict_types=False)
    yield "nan reward", _scored_with(reward=float("nan"))
    yield "inf advantage", _scored_with(advantage=float("-inf"))
    yield "non-utf8 value", b"\x82\xa6schema\xa4Task\xa7task_id\xa2\xc3\x28"


def _required(schema: str) -> list[str]:
    fields = msgspec.structs.fields(codec.SCHEMAS[schema])
    return ["schema", *(f.name for f in fields if f.required)]


def _scored_with(**fields: Any) -> bytes:
    data = next(d for d in seeds() if msgpack.unpackb(d)["schema"] == "ScoredTrajectory")
    return msgpack.packb(msgpack.unpackb(data) | fields)


@pytest.mark.timeout(60)
def test_crafted_hostile_inputs() -> None:
    cases = list(_crafted())
    assert len(cases) > 1000
    kinds: dict[str, list[str]] = {}
    for kind, data in cases:
        kinds.setdefault(kind, []).append(outcome(data))
    for kind, results in kinds.items():
        if kind == "wrong type":  # a str field accepts "x" * 300, a bytes one b"\x00" * 64 ...
            assert results.count("error") > len(results) // 3, kind
        else:  # every version but 1 is refused, and so is 1.0, "1", True or nil
            assert set(results) == {"error"}, kind


@settings(max_examples=1500, deadline=None, database=None)
@given(st.binary(max_size=400))
def test_hypothesis_bytes(data: bytes) -> None:
    assert outcome(data) in ("ok", "error")
