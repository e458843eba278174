"""`rollstream export`: a topic's messages to a file, for archiving beyond Kafka retention.

Formats (from the file name, or given): JSON Lines (`.jsonl`), MessagePack (`.msgpack`,
the exact wire bytes) and, when pyarrow is installed, Parquet (`.parquet`: one row per
record with the envelope as columns, the wire bytes in `value` and the JSON in `json`).
A `.gz` suffix compresses JSONL and MessagePack. `rollstream replay --file` reads JSONL
and MessagePack back (services/logfiles.py). Claim checks are resolved, so a file is
whole without the blob store. Records that do not decode are left out and counted (the
consumer that met them dead-lettered them already). The file appears atomically: it is
written under a temporary name and renamed when complete.
"""

from __future__ import annotations

import gzip
import os
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from schemas import codec, topics
from schemas.envelope import Message
from schemas.messages import ScoredTrajectory
from services import kafka_read, logfiles

if TYPE_CHECKING:
    from services.settings import Settings

FORMATS = ("jsonl", "msgpack", "parquet")


@dataclass
class ExportReport:
    topic: str
    path: str
    format: str
    written: int = 0
    by_schema: Counter[str] = field(default_factory=Counter)
    skipped: Counter[str] = field(default_factory=Counter)

    def to_json(self) -> dict[str, Any]:
        return {
            "topic": self.topic,
            "path": self.path,
            "format": self.format,
            "written": self.written,
            "by_schema": dict(self.by_schema),
            "skipped": dict(self.skipped),
        }


def format_of(path: Path, given: str | None = None) -> str:
    if given is not None:
        if given not in FORMATS:
            raise ValueError(f"unknown format {given!r} (choose from {', '.join(FORMATS)})")
        return given
    if path.name.lower().endswith(".parquet"):
        return "parquet"
    try:
        return logfiles.kind_of(path)
    except logfiles.LogFileError:
        raise ValueError(
            f"{path}: cannot tell the format from the name; end it in .jsonl, .msgpack or "
            ".parquet (optionally .gz), or pass --format"
        ) from None


async def export(
    settings: Settings,
    topic: str,
    out: Path,
    selection: kafka_read.Selection | None = None,
    fmt: str | None = None,
) -> ExportReport:
    """Write the selected records of `{prefix}.{topic}` to `out`."""
    from services import blobs

    if topic not in topics.BY_NAME:
        raise ValueError(f"unknown topic {topic!r} (one of {', '.join(topics.BY_NAME)})")
    name = topics.BY_NAME[topic].full_name(settings.topics.prefix)
    kind = format_of(out, fmt)
    if kind == "parquet":
        _require_pyarrow()
    report = ExportReport(name, str(out), kind)
    rows: list[tuple[kafka_read.Record, Message]] = []
    claim = blobs.from_settings(settings)
    try:
        with _AtomicFile(out, compress=kind != "parquet") as fh:
            timeout = settings.replay.read_timeout_s
            async for rec in kafka_read.records(settings, name, selection, timeout):
                msg = await _decode(claim, rec, report)
                if msg is None:
                    continue
                if kind == "parquet":
                    rows.append((rec, msg))
                else:
                    fh.write(_encode(kind, rec, msg))
                report.written += 1
                report.by_schema[type(msg).__name__] += 1
            if kind == "parquet":
                _write_parquet(fh, rows)
    finally:
        await claim.aclose()
    return report


async def _decode(claim: Any, rec: kafka_read.Record, report: ExportReport) -> Message | None:
    try:
        msg: Message = await claim.unpack(rec.value or b"")
    except codec.SchemaError as exc:
        report.skipped[f"undecodable: {exc.where}: {exc.why}"[:160]] += 1
        return None
    return msg


def _encode(kind: str, rec: kafka_read.Record, msg: Message) -> bytes:
    if kind == "msgpack":
        return codec.encode(msg)
    return logfiles.json_line(
        msg,
        topic=rec.topic,
        partition=rec.partition,
        offset=rec.offset,
        timestamp_ms=rec.timestamp_ms,
        key=rec.key,
    )


class _AtomicFile:
    """A temporary file next to `path`, renamed onto it on success, removed on failure."""

    def __init__(self, path: Path, compress: bool) -> None:
        self.path = path
        self.compress = compress and path.name.lower().endswith(".gz")
        self.tmp = ""
        self.raw: Any = None
        self.fh: Any = None

    def __enter__(self) -> Any:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, self.tmp = tempfile.mkstemp(dir=self.path.parent, prefix=f".{self.path.name}.")
        self.raw = os.fdopen(fd, "wb")
        self.fh = gzip.GzipFile(fileobj=self.raw, mode="wb") if self.compress else self.raw
        return self.fh

    def __exit__(self, exc_type: Any, *_: Any) -> None:
        assert self.fh is not None and self.raw is not None
        try:
            if self.fh is not self.raw:
                self.fh.close()
            self.raw.flush()
            os.fsync(self.raw.fileno())
            self.raw.close()
            if exc_type is None:
                os.replace(self.tmp, self.path)
        finally:
            if os.path.exists(self.tmp):
                os.unlink(self.tmp)


def _require_pyarrow() -> None:
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        raise ValueError(
            "Parquet needs pyarrow, which is not installed (pip install pyarrow); "
            "or export to .jsonl / .msgpack"
        ) from None


def _write_parquet(fh: IO[bytes], rows: list[tuple[kafka_read.Record, Message]]) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    def col(fn: Any) -> list[Any]:
        return [fn(rec, msg) for rec, msg in rows]

    table = pa.table(
        {
            "topic": col(lambda r, m: r.topic),
            "partition": pa.array(col(lambda r, m: r.partition), pa.int32()),
            "offset": pa.array(col(lambda r, m: r.offset), pa.int64()),
            "timestamp_ms": pa.array(col(lambda r, m: r.timestamp_ms), pa.int64()),
            "key": col(lambda r, m: None if r.key is None else r.key.decode("utf-8", "replace")),
            "schema": col(lambda r, m: type(m).__name__),
            "id": col(lambda r, m: m.id),
            "origin": col(lambda r, m: str(m.origin)),
            "parent_id": col(lambda r, m: m.parent_id),
            "created_at": pa.array(col(lambda r, m: m.created_at), pa.float64()),
            "reward": col(lambda r, m: m.reward if isinstance(m, ScoredTrajectory) else None),
            "value": pa.array(col(lambda r, m: codec.encode(m)), pa.binary()),
            "json": col(lambda r, m: logfiles.message_json(m)),
        }
    )
    pq.write_table(table, fh)
