"""Log files of messages (JSONL and MessagePack): round trips, hand-written lines, and
errors that name the file and the place."""

from __future__ import annotations

import gzip
import io
import json
from pathlib import Path

import pytest

from schemas import codec
from schemas.arrays import pack_f32, pack_i32
from schemas.messages import LedgerEntry, LedgerStatus, ScoredTrajectory, Trajectory, VerifierSpec
from schemas.sandbox import Outcome
from services import logfiles
from services.export import format_of


def sample(i: int) -> Trajectory:
    return Trajectory(
        task_id=f"t{i}",
        group_id=f"g{i}",
        group_size=1,
        verifier=VerifierSpec(name="exact", answer="42", needs_sandbox=False),
        completion="x" * (i * 300),
        prompt_tokens=pack_i32([1, 2, 3]),
        completion_tokens=pack_i32([4, 5]),
        behaviour_logprobs=pack_f32([-0.5, -1.5]),
    )


MESSAGES = [
    *[sample(i) for i in range(20)],
    ScoredTrajectory(trajectory=sample(3), reward=1.0, outcome=Outcome.PASSED),
    LedgerEntry(trajectory_id="x", status=LedgerStatus.DROPPED, reason="stale: lag 9"),
]


def test_jsonl_round_trip_keeps_every_field_and_the_record_position() -> None:
    data = b"".join(
        logfiles.json_line(m, topic="p.x", partition=2, offset=i, timestamp_ms=7, key=b"k")
        for i, m in enumerate(MESSAGES)
    )
    entries = list(logfiles.read_jsonl(io.BytesIO(data), "f.jsonl"))
    assert [e.message for e in entries] == MESSAGES
    assert [e.offset for e in entries] == list(range(len(MESSAGES)))
    assert {(e.topic, e.partition, e.timestamp_ms) for e in entries} == {("p.x", 2, 7)}
    line = json.loads(data.splitlines()[0])
    assert line["key"] == "k" and line["message"]["schema"] == "Trajectory"


def test_jsonl_accepts_bare_messages_and_blank_lines() -> None:
    bare = logfiles.message_json(MESSAGES[0]).encode()
    entries = list(logfiles.read_jsonl(io.BytesIO(b"\n" + bare + b"\n\n")))
    assert [e.message for e in entries] == [MESSAGES[0]] and entries[0].offset == -1


@pytest.mark.parametrize(
    ("line", "why"),
    [
        (b"{not json", "not JSON"),
        (b"[1, 2]", "expected a JSON object"),
        (b'{"topic": "x"}', "expected a message object"),
        (b'{"schema": "Trajectory", "task_id": "t"}', "not a valid message"),
        (b'{"schema": "Nope"}', "not a valid message"),
    ],
)
def test_jsonl_errors_name_file_and_line(line: bytes, why: str) -> None:
    good = logfiles.json_line(MESSAGES[0])
    with pytest.raises(logfiles.LogFileError, match=f"f.jsonl:2: .*{why}"):
        list(logfiles.read_jsonl(io.BytesIO(good + line + b"\n"), "f.jsonl"))


def test_msgpack_round_trip_of_wire_bytes() -> None:
    data = b"".join(codec.encode(m) for m in MESSAGES)
    assert [e.message for e in logfiles.read_msgpack(io.BytesIO(data))] == MESSAGES


def test_msgpack_truncated_and_garbage_are_errors_with_a_byte_position() -> None:
    first = codec.encode(MESSAGES[0])
    cut = first + codec.encode(MESSAGES[1])[:-3]
    with pytest.raises(logfiles.LogFileError, match=f"f.msgpack@{len(first)}: .*ends inside"):
        list(logfiles.read_msgpack(io.BytesIO(cut), "f.msgpack"))
    with pytest.raises(logfiles.LogFileError, match=r"f\.msgpack@0"):
        list(logfiles.read_msgpack(io.BytesIO(b"\xc1\xc1\xc1"), "f.msgpack"))
    with pytest.raises(logfiles.LogFileError, match=r"f\.msgpack@0: .*schema"):
        list(logfiles.read_msgpack(io.BytesIO(b"\x81\xa1a\x01"), "f.msgpack"))


def test_read_file_by_suffix_and_gzip(tmp_path: Path) -> None:
    plain = tmp_path / "a.msgpack"
    plain.write_bytes(b"".join(codec.encode(m) for m in MESSAGES[:3]))
    packed = tmp_path / "b.jsonl.gz"
    packed.write_bytes(gzip.compress(b"".join(logfiles.json_line(m) for m in MESSAGES[:3])))
    assert [e.message for e in logfiles.read_file(plain)] == MESSAGES[:3]
    assert [e.message for e in logfiles.read_file(packed)] == MESSAGES[:3]
    with pytest.raises(logfiles.LogFileError, match="unknown log file type"):
        list(logfiles.read_file(tmp_path / "c.txt"))
    with pytest.raises(logfiles.LogFileError, match=r"missing\.jsonl"):
        list(logfiles.read_file(tmp_path / "missing.jsonl"))


def test_export_format_from_name() -> None:
    assert format_of(Path("x.jsonl")) == "jsonl"
    assert format_of(Path("x.msgpack.gz")) == "msgpack"
    assert format_of(Path("x.parquet")) == "parquet"
    assert format_of(Path("x.bin"), "msgpack") == "msgpack"
    with pytest.raises(ValueError, match="--format"):
        format_of(Path("x.bin"))
    with pytest.raises(ValueError, match="unknown format"):
        format_of(Path("x.jsonl"), "csv")
