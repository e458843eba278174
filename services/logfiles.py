"""Log files of messages: what `rollstream export` writes and `rollstream replay` reads.

Two formats, both one message after another (pure, no Kafka):

- JSON Lines (``.jsonl``): one JSON object per line, ``{"topic", "partition", "offset",
  "timestamp_ms", "key", "message"}``, where ``message`` is the message in JSON (the
  msgspec mapping of its struct: packed arrays such as token ids are base64 strings).
  A line may also be a bare message object (it has a ``schema`` field), so hand-written
  files work. JSON decodes with the current structs.
- MessagePack (``.msgpack``/``.mpk``): the messages' exact wire bytes, concatenated. They
  decode through the codec, older versions upgraded as on Kafka.

Claim checks are resolved before writing (a file outlives the blob store's TTL), so no
file holds a BlobRef that points elsewhere.
"""

from __future__ import annotations

import base64
import io
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Final, Union, cast

import msgspec

from schemas import codec
from schemas.envelope import Message
from schemas.messages import ALL_MESSAGES

JSONL_SUFFIXES: Final = (".jsonl", ".json", ".ndjson")
MSGPACK_SUFFIXES: Final = (".msgpack", ".mpk", ".msgp")

_ANY = Union[ALL_MESSAGES]  # type: ignore[valid-type]  # noqa: UP007
_JSON_DECODER: Final = msgspec.json.Decoder(_ANY)
_JSON_ENCODER: Final = msgspec.json.Encoder()


class LogFileError(ValueError):
    """A log file that cannot be read: which file, where, and why."""


@dataclass(frozen=True, slots=True)
class Entry:
    """One message of a log file, with where it came from when the file says."""

    message: Message
    topic: str = ""
    partition: int = -1
    offset: int = -1
    timestamp_ms: int = -1
    where: str = ""
    """file:line (JSONL) or file@byte (MessagePack), for error messages."""


def kind_of(path: Path) -> str:
    """`jsonl` or `msgpack`, from the file name."""
    name = path.name.lower().removesuffix(".gz")
    if name.endswith(JSONL_SUFFIXES):
        return "jsonl"
    if name.endswith(MSGPACK_SUFFIXES):
        return "msgpack"
    want = ", ".join(JSONL_SUFFIXES + MSGPACK_SUFFIXES)
    raise LogFileError(f"{path}: unknown log file type (want a name ending in {want})")


# -- JSON Lines -----------------------------------------------------------------------


def json_line(
    msg: Message,
    *,
    topic: str = "",
    partition: int = -1,
    offset: int = -1,
    timestamp_ms: int = -1,
    key: bytes | None = None,
) -> bytes:
    """One JSONL line (with its newline) for a message and where it was read."""
    head = {
        "topic": topic,
        "partition": partition,
        "offset": offset,
        "timestamp_ms": timestamp_ms,
        "key": _key_text(key),
    }
    body = _JSON_ENCODER.encode(head)[:-1] + b',"message":' + _JSON_ENCODER.encode(msg) + b"}"
    return body + b"\n"


def message_json(msg: Message) -> str:
    """A message as a JSON document."""
    return _JSON_ENCODER.encode(msg).decode()


def _key_text(key: bytes | None) -> str | None:
    if key is None:
        return None
    try:
        return key.decode("utf-8")
    except UnicodeDecodeError:
        return "base64:" + base64.b64encode(key).decode()


def message_from_json(data: bytes | str) -> Message:
    """A message from its JSON object (ValueError with the reason otherwise)."""
    try:
        msg = _JSON_DECODER.decode(data)
    except msgspec.ValidationError as exc:
        raise ValueError(f"not a valid message: {exc}") from None
    except msgspec.DecodeError as exc:
        raise ValueError(f"not JSON: {exc}") from None
    return codec.validate(msg)


def read_jsonl(stream: IO[bytes], name: str = "<jsonl>") -> Iterator[Entry]:
    for lineno, line in enumerate(stream, 1):
        if not line.strip():
            continue
        where = f"{name}:{lineno}"
        try:
            yield _entry_from_line(line, where)
        except (ValueError, codec.SchemaError) as exc:
            raise LogFileError(f"{where}: {exc}") from None


def _entry_from_line(line: bytes, where: str) -> Entry:
    try:
        head = msgspec.json.decode(line)
    except msgspec.DecodeError as exc:
        raise ValueError(f"not JSON: {exc}") from None
    if not isinstance(head, dict):
        raise ValueError("expected a JSON object")
    if "schema" in head:  # a bare message
        return Entry(message_from_json(line), where=where)
    if not isinstance(head.get("message"), dict):
        raise ValueError('expected a message object, or {"message": {...}, ...}')
    msg = message_from_json(msgspec.json.encode(head["message"]))
    return Entry(
        msg,
        topic=str(head.get("topic") or ""),
        partition=_int(head.get("partition")),
        offset=_int(head.get("offset")),
        timestamp_ms=_int(head.get("timestamp_ms")),
        where=where,
    )


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else -1


# -- MessagePack ----------------------------------------------------------------------


def read_msgpack(stream: IO[bytes], name: str = "<msgpack>") -> Iterator[Entry]:
    """Concatenated wire messages; each is decoded (and upgraded) by the codec."""
    import msgpack

    buffer = _Tee(stream)
    unpacker = msgpack.Unpacker(buffer, raw=True, max_buffer_size=codec.MAX_MESSAGE_BYTES)
    start = 0
    while True:
        try:
            unpacker.skip()
        except msgpack.OutOfData:
            if buffer.leftover(unpacker.tell()):
                raise LogFileError(f"{name}@{start}: file ends inside a message") from None
            return
        except (ValueError, msgpack.UnpackException) as exc:
            raise LogFileError(f"{name}@{start}: not MessagePack: {exc}") from None
        end = unpacker.tell()
        raw = buffer.take(start, end)
        try:
            msg = codec.decode(raw)
        except codec.SchemaError as exc:
            raise LogFileError(f"{name}@{start}: {exc}") from None
        yield Entry(msg, where=f"{name}@{start}")
        start = end


class _Tee(io.RawIOBase):
    """A readable stream that keeps what was read since the last message, so each
    message's exact bytes can be handed to the codec."""

    def __init__(self, inner: IO[bytes]) -> None:
        self.inner = inner
        self.kept = bytearray()
        self.base = 0
        """Stream position of kept[0]."""

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        data = self.inner.read(len(b))
        n = len(data)
        b[:n] = data
        self.kept += data
        return n

    def take(self, start: int, end: int) -> bytes:
        raw = bytes(self.kept[start - self.base : end - self.base])
        del self.kept[: end - self.base]
        self.base = end
        return raw

    def leftover(self, position: int) -> bool:
        """True when bytes remain after `position` (a message was cut short)."""
        return len(self.kept) > position - self.base


# -- files ----------------------------------------------------------------------------


def read_file(path: Path) -> Iterator[Entry]:
    """Every message of a log file (gzip-compressed when the name ends in .gz)."""
    kind = kind_of(path)
    opener = _open_gz if path.name.lower().endswith(".gz") else _open_plain
    with opener(path) as stream:
        if kind == "jsonl":
            yield from read_jsonl(stream, str(path))
        else:
            yield from read_msgpack(stream, str(path))


def _open_plain(path: Path) -> IO[bytes]:
    try:
        return path.open("rb")
    except OSError as exc:
        raise LogFileError(f"{path}: {exc.strerror or exc}") from None


def _open_gz(path: Path) -> IO[bytes]:
    import gzip

    try:
        return cast(IO[bytes], gzip.open(path, "rb"))
    except OSError as exc:
        raise LogFileError(f"{path}: {exc.strerror or exc}") from None
