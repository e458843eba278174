"""Every message round-trips, and the wire is plain MessagePack that the reference `msgpack`
package reads and writes with the same fields."""

from __future__ import annotations

import struct
from typing import Any

import msgpack
import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from schemas import arrays, codec, topics
from schemas.messages import (
    ALL_MESSAGES,
    ChatMessage,
    Feedback,
    LedgerEntry,
    LedgerStatus,
    Message,
    Outcome,
    ScoredTrajectory,
    Task,
    Trajectory,
    VerifierSpec,
)
from tests.unit.schema_strategies import BY_TYPE, messages

PROPERTY = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def builtins(msg: Message) -> dict[str, Any]:
    """The message as plain data, bytes kept as bytes (what msgpack yields)."""
    out = msgspec.to_builtins(msg, builtin_types=(bytes,))
    assert isinstance(out, dict)
    return out


def test_every_message_type_has_a_strategy_and_a_schema_entry() -> None:
    assert set(BY_TYPE) == set(ALL_MESSAGES)
    assert set(codec.SCHEMAS) == {cls.__name__ for cls in ALL_MESSAGES}
    assert all(codec.SCHEMAS[cls.__name__] is cls for cls in ALL_MESSAGES)


@PROPERTY
@given(messages)
def test_round_trip(msg: Message) -> None:
    data = codec.encode(msg)
    assert codec.decode(data) == msg
    assert codec.decode(data, type(msg)) == msg
    assert codec.encode(codec.decode(data)) == data  # byte-stable


@PROPERTY
@given(messages)
def test_reference_msgpack_reads_the_same_fields(msg: Message) -> None:
    raw = msgpack.unpackb(codec.encode(msg), raw=False)
    assert raw == builtins(msg)
    assert raw["schema"] == type(msg).__name__
    assert {"v", "id", "created_at", "origin", "parent_id"} <= raw.keys()


@PROPERTY
@given(messages)
def test_reference_msgpack_writes_what_decode_reads(msg: Message) -> None:
    data = msgpack.packb(builtins(msg), use_bin_type=True)
    assert codec.decode(data, type(msg)) == msg


EXTRA_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.text() | st.binary(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
    max_leaves=10,
)


@PROPERTY
@given(messages, st.dictionaries(st.text().map(lambda s: "zz_" + s), EXTRA_VALUES, max_size=4))
def test_unknown_fields_are_ignored(msg: Message, extra: dict[str, Any]) -> None:
    raw = builtins(msg) | extra
    assert codec.decode(msgpack.packb(raw, use_bin_type=True)) == msg


@PROPERTY
@given(st.lists(st.integers(-(2**31), 2**31 - 1), max_size=300))
def test_pack_i32_is_little_endian_int32(values: list[int]) -> None:
    packed = arrays.pack_i32(values)
    assert packed == struct.pack(f"<{len(values)}i", *values)
    assert list(arrays.unpack_i32(packed)) == values
    assert arrays.count(packed) == len(values)


@PROPERTY
@given(st.lists(st.floats(width=32), max_size=300))
def test_pack_f32_is_little_endian_float32(values: list[float]) -> None:
    packed = arrays.pack_f32(values)
    assert packed == struct.pack(f"<{len(values)}f", *values)
    back = arrays.unpack_f32(packed)
    assert [struct.pack("<f", x) for x in back] == [struct.pack("<f", x) for x in values]


def test_packed_array_errors_are_value_errors() -> None:
    with pytest.raises(ValueError, match="pack_i32"):
        arrays.pack_i32([2**31])
    with pytest.raises(ValueError, match="pack_i32"):
        arrays.pack_i32([1.5])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="multiple of 4"):
        arrays.unpack_f32(b"\x00" * 5)
    assert arrays.pack_f32([1e39]) == struct.pack("<f", float("inf"))


def verifier() -> VerifierSpec:
    return VerifierSpec(name="exact", answer="42", needs_sandbox=False)


def trajectory(**kw: Any) -> Trajectory:
    base: dict[str, Any] = {
        "task_id": "t1",
        "group_id": "g1",
        "group_size": 4,
        "verifier": verifier(),
        "completion_tokens": arrays.pack_i32([5, 6, 7]),
    }
    return Trajectory(**(base | kw))


@pytest.mark.parametrize(
    ("kw", "error"),
    [
        ({"behaviour_logprobs": arrays.pack_f32([0.0, 0.0])}, "behaviour_logprobs: 8 bytes"),
        ({"policy_versions": arrays.pack_i32([1])}, "policy_versions: 4 bytes"),
        ({"completion_mask": b"\x01"}, "completion_mask: 1 bytes, expected 3"),
        ({"prompt_tokens": b"\x00\x01"}, "prompt_tokens: length is not a multiple of 4"),
        ({"index": 4}, "index 4 is not below group_size 4"),
    ],
)
def test_trajectory_checks_per_token_alignment(kw: dict[str, Any], error: str) -> None:
    with pytest.raises(ValueError, match=error):
        trajectory(**kw)
    good = codec.encode(trajectory())
    raw = msgpack.unpackb(good) | kw
    with pytest.raises(codec.SchemaError, match=error):
        codec.decode(msgpack.packb(raw))


def test_production_trace_without_tokens_or_logprobs_is_valid() -> None:
    traj = trajectory(
        completion_tokens=b"",
        messages=[ChatMessage(role="user", content="2+2?"), ChatMessage(role="assistant")],
    )
    assert traj.behaviour_logprobs is None and traj.policy_version == -1
    assert codec.validate(traj) == traj


def test_cross_field_rules_of_other_messages() -> None:
    with pytest.raises(ValueError, match="exactly one of `prompt` and `messages`"):
        Task(task_id="t", suite="s", verifier=verifier(), group_size=2)
    with pytest.raises(ValueError, match="exactly one"):
        Task(
            task_id="t",
            suite="s",
            prompt="p",
            messages=[ChatMessage(role="user", content="p")],
            verifier=verifier(),
            group_size=2,
        )
    with pytest.raises(ValueError, match="must be finite"):
        ScoredTrajectory(trajectory=trajectory(), reward=float("nan"), outcome=Outcome.PASSED)
    with pytest.raises(ValueError, match="needs a mask_reason"):
        ScoredTrajectory(trajectory=trajectory(), reward=0, outcome=Outcome.PASSED, masked=True)
    with pytest.raises(ValueError, match="dropped ledger entry needs a reason"):
        LedgerEntry(trajectory_id="x", status=LedgerStatus.DROPPED)
    with pytest.raises(ValueError, match="needs a score, a label"):
        Feedback(trace_id="x")


def test_scored_trajectory_exposes_its_keys() -> None:
    traj = trajectory()
    scored = ScoredTrajectory(trajectory=traj, reward=1, outcome=Outcome.PASSED)
    assert scored.group_id == "g1" and scored.trajectory_id == traj.id


def test_every_topic_carries_registered_schemas_with_its_key_field() -> None:
    for spec in topics.ALL:
        assert spec.schemas, spec.name
        for name in spec.schemas:
            cls = codec.SCHEMAS[name]
            fields = {f.name for f in msgspec.structs.fields(cls)}
            assert spec.key in fields or isinstance(getattr(cls, spec.key, None), property), (
                f"{name} on {spec.name} lacks its key {spec.key}"
            )


def test_key_for() -> None:
    traj = trajectory()
    scored = ScoredTrajectory(trajectory=traj, reward=1, outcome=Outcome.PASSED)
    assert topics.key_for(topics.TRAJECTORIES, traj) == b"g1"
    assert topics.key_for(topics.REWARDS, scored) == b"g1"
    entry = LedgerEntry(trajectory_id=traj.id, status=LedgerStatus.TRAINED)
    assert topics.key_for(topics.LEDGER, entry) == traj.id.encode()
    with pytest.raises(ValueError, match="has no 'task_id', the key of tasks"):
        topics.key_for(topics.TASKS, entry)


def test_feedback_tests_are_optional_and_travel_apart_from_scoring_tests() -> None:
    public = "from solution import f\n\ndef test_0():\n    assert f(1) == 2\n"
    hidden = "from solution import f\n\ndef test_0():\n    assert f(7) == 8\n"
    spec = VerifierSpec(name="python_tests", tests=hidden, feedback_tests=public)
    task = Task(task_id="t", suite="s", prompt="p", verifier=spec, group_size=2)
    raw = msgpack.unpackb(codec.encode(task), raw=False)
    assert raw["verifier"]["feedback_tests"] == public
    assert raw["verifier"]["tests"] == hidden
    # a writer that predates the field (or leaves it out) still decodes, as None
    del raw["verifier"]["feedback_tests"]
    old = codec.decode(msgpack.packb(raw, use_bin_type=True), Task)
    assert old.verifier.feedback_tests is None
    assert old.verifier.tests == hidden
