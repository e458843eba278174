"""Codec contract: SchemaError (what, where, why) for every bad input; versions."""

from __future__ import annotations

from typing import Any

import msgpack
import msgspec
import pytest

from schemas import arrays, codec
from schemas.codec import Codec, SchemaError
from schemas.messages import (
    Message,
    Outcome,
    ScoredTrajectory,
    Task,
    Trajectory,
    VerifierSpec,
)


def task() -> Task:
    return Task(
        task_id="t1", suite="s", prompt="2+2?", verifier=VerifierSpec(name="exact"), group_size=4
    )


def raw_task(**changes: Any) -> dict[str, Any]:
    raw: dict[str, Any] = msgpack.unpackb(codec.encode(task()))
    for key, value in changes.items():
        if value is _DROP:
            raw.pop(key)
        else:
            raw[key] = value
    return raw


_DROP = object()


def raises(fn: Any, *args: Any) -> SchemaError:
    with pytest.raises(SchemaError) as info:
        fn(*args)
    return info.value


def error_of(data: Any, expected: type[Message] | None = None) -> SchemaError:
    with pytest.raises(SchemaError) as info:
        codec.decode(data, expected)
    return info.value


def test_schema_error_reads_what_at_where_why() -> None:
    err = SchemaError("Trajectory", "$.group_size", "Expected `int` >= 1")
    assert str(err) == "Trajectory at $.group_size: Expected `int` >= 1"
    assert (err.what, err.where, err.why) == ("Trajectory", "$.group_size", "Expected `int` >= 1")
    assert isinstance(err, ValueError)


@pytest.mark.parametrize(
    ("changes", "what", "where", "why"),
    [
        ({"group_size": 0}, "Task", "$.group_size", "Expected `int` >= 1"),
        ({"group_size": "4"}, "Task", "$.group_size", "Expected `int`, got `str`"),
        ({"suite": _DROP}, "Task", "$", "missing required field `suite`"),
        ({"verifier": {"version": "1"}}, "Task", "$.verifier", "missing required field `name`"),
        ({"origin": "elsewhere"}, "Task", "$.origin", "Invalid enum value 'elsewhere'"),
        ({"v": 2}, "Task", "$.v", "version 2 is newer than this reader knows (1)"),
        ({"v": 0}, "Task", "$.v", "version 0 is not a valid version"),
        ({"v": "1"}, "Task", "$.v", "expected an integer, got string"),
        ({"schema": "Rocket"}, "Rocket", "$.schema", "unknown schema (known: BlobRef"),
        ({"schema": 7}, "message", "$.schema", "expected a string, got int"),
        ({"schema": _DROP}, "message", "$.schema", "missing"),
        ({"prompt": None}, "Task", "$", "exactly one of `prompt` and `messages`"),
    ],
)
def test_invalid_messages_say_what_where_why(
    changes: dict[str, Any], what: str, where: str, why: str
) -> None:
    err = error_of(msgpack.packb(raw_task(**changes)))
    assert (err.what, err.where) == (what, where), str(err)
    assert why in err.why, str(err)


@pytest.mark.parametrize(
    ("data", "where", "why"),
    [
        (b"", "$", "empty input"),
        (b"\xc1", "byte 0", "invalid opcode"),
        (msgpack.packb([1, 2]), "$", "expected a map with a `schema` key, got array"),
        (msgpack.packb("Task"), "$", "got string"),
        (b"\xdb\xff\xff\xff\xff", "byte 5", "truncated"),
        (msgpack.packb({"schema": "Task"}) + b"\x00", "byte 13", "trailing characters"),
        (b"\x81\xa6schema\xa2\xff\xfe", "$", "Invalid UTF-8"),
    ],
)
def test_malformed_bytes(data: bytes, where: str, why: str) -> None:
    err = error_of(data)
    assert err.where == where and why in err.why, str(err)


@pytest.mark.parametrize("value", [None, "text", 42, [b"x"]])
def test_non_bytes_input_is_a_schema_error(value: Any) -> None:
    err = error_of(value)
    assert err.what == "bytes" and "expected bytes" in err.why
    if value is None:
        assert "tombstone" in err.why


def test_buffers_other_than_bytes_decode() -> None:
    data = codec.encode(task())
    assert codec.decode(bytearray(data)) == codec.decode(memoryview(data)) == codec.decode(data)


def test_expected_type_mismatch() -> None:
    err = error_of(codec.encode(task()), Trajectory)
    assert (err.what, err.where, err.why) == (
        "Trajectory",
        "$.schema",
        "expected Trajectory, got Task",
    )

    class Stray(Message, kw_only=True):
        pass

    err = error_of(codec.encode(task()), Stray)
    assert err.why == "not a registered message schema"
    assert isinstance(codec.decode(codec.encode(task()), Message), Task)


def test_size_cap_is_checked_before_parsing() -> None:
    small = Codec([Task], max_bytes=2048)
    err = raises(small.decode, b"\x00" * 2049)
    assert err.where == "length" and "exceeds the codec cap of 2048" in err.why
    big = task()
    big.prompt = "x" * 4096
    err = raises(small.encode, big)
    assert err.what == "Task" and err.where == "encoded size"


def test_deep_nesting_is_refused_not_crashing() -> None:
    deep = b"\x91" * 200_000 + b"\xc0"
    assert "nested too deeply" in error_of(deep).why
    raw = raw_task()
    packer = msgpack.Packer()
    body = b"".join(packer.pack(k) + packer.pack(v) for k, v in raw.items())
    header = packer.pack_map_header(len(raw) + 1)
    nested_unknown = header + body + packer.pack("z") + deep  # an unknown key, nested deep
    assert error_of(nested_unknown).why == "nested too deeply"


def test_encode_refuses_unregistered_and_unencodable() -> None:
    class Stray(Message, kw_only=True):
        pass

    assert raises(codec.encode, Stray()).where == "$.schema"
    bad = task()
    bad.metadata = {"k": object()}  # type: ignore[dict-item]
    err = raises(codec.encode, bad)
    assert err.what == "Task" and "cannot encode" in err.why


def test_validate_catches_what_constructors_do_not() -> None:
    traj = Trajectory(task_id="t", group_id="g", group_size=2, verifier=VerifierSpec(name="e"))
    assert codec.validate(traj) == traj
    traj.group_size = 0  # constructors do not check constraints; validate does
    assert raises(codec.validate, traj).where == "$.group_size"


def test_nested_message_versions_are_checked() -> None:
    traj = Trajectory(task_id="t", group_id="g", group_size=2, verifier=VerifierSpec(name="e"))
    scored = ScoredTrajectory(trajectory=traj, reward=1.0, outcome=Outcome.PASSED)
    raw = msgpack.unpackb(codec.encode(scored))
    raw["trajectory"]["v"] = 9
    err = error_of(msgpack.packb(raw))
    assert (err.what, err.where) == ("Trajectory", "$.trajectory.v"), str(err)


# -- evolution: a v2 schema with an additive change and a v3 with a rename ---------------


class Gadget(Message, kw_only=True):
    """Version 3: v2 added `color` (additive); v3 renamed `size_cm` to `size_mm` (breaking)."""

    v: int = 3
    size_mm: int
    color: str = "grey"


class Box(Message, kw_only=True):
    gadget: Gadget
    label: str = ""


def _gadget_2_to_3(d: dict[str, Any]) -> None:
    d["size_mm"] = d.pop("size_cm") * 10


def _explode(d: dict[str, Any]) -> None:
    raise KeyError("boom")


EVOLVING = Codec([Gadget, Box], upgrades={("Gadget", 2): _gadget_2_to_3})


def packed(**fields: Any) -> bytes:
    return msgpack.packb({"schema": "Gadget", "id": "g-1", **fields})


def test_older_versions_upgrade_through_hooks() -> None:
    v1 = EVOLVING.decode(packed(v=1, size_cm=3))
    assert isinstance(v1, Gadget)
    assert (v1.v, v1.size_mm, v1.color, v1.id) == (3, 30, "grey", "g-1")
    v2 = EVOLVING.decode(packed(v=2, size_cm=4, color="red"), Gadget)
    assert (v2.v, v2.size_mm, v2.color) == (3, 40, "red")
    v3 = EVOLVING.decode(packed(v=3, size_mm=5))
    assert (v3.v, v3.size_mm) == (3, 5)


def test_nested_older_versions_upgrade() -> None:
    data = msgpack.packb(
        {"schema": "Box", "gadget": {"schema": "Gadget", "v": 1, "size_cm": 2}, "label": "b"}
    )
    box = EVOLVING.decode(data, Box)
    assert box.gadget.size_mm == 20 and box.gadget.v == 3 and box.label == "b"


def test_additive_change_needs_no_hook() -> None:
    additive = Codec([Gadget])  # no hooks at all: v2 data decodes as is
    g = additive.decode(packed(v=2, size_mm=7))
    assert isinstance(g, Gadget) and (g.v, g.size_mm, g.color) == (3, 7, "grey")


def test_versions_newer_than_known_and_failing_hooks() -> None:
    err = raises(EVOLVING.decode, packed(v=4, size_mm=1))
    assert (err.what, err.where) == ("Gadget", "$.v") and "newer" in err.why
    failing = Codec([Gadget], upgrades={("Gadget", 1): _explode})
    err = raises(failing.decode, packed(v=1, size_mm=1))
    assert "upgrade v1 -> v2 failed: KeyError" in err.why
    err = raises(EVOLVING.decode, packed(v=1, size_mm=1))
    assert "size_cm" in err.why  # the hook's KeyError, named


def test_hooks_must_name_an_older_version_of_a_known_schema() -> None:
    with pytest.raises(ValueError, match="Gadgett v1: no such older version"):
        Codec([Gadget], upgrades={("Gadgett", 1): _gadget_2_to_3})
    with pytest.raises(ValueError, match="Gadget v3: no such older version"):
        Codec([Gadget], upgrades={("Gadget", 3): _gadget_2_to_3})


def test_default_codec_knows_every_schema_at_version_1() -> None:
    for cls in codec.SCHEMAS.values():
        assert codec.DEFAULT.current_version(cls) == 1
    assert msgspec.structs.fields(Trajectory)[0].name == "v"
    assert arrays.count(b"") == 0
