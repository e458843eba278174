"""Encode and decode wire messages: MessagePack, validated, versioned.

- ``encode(msg) -> bytes``: a MessagePack map; the ``schema`` key carries the struct's name.
- ``decode(data, expected=None)``: validates types and constraints (schemas/fields.py and
  each struct's __post_init__), ignores unknown keys, upgrades older versions
  (schemas/upgrades.py) and returns a current-version message (``v`` is the reader's
  version afterwards). Anything else raises SchemaError, never another exception.
- Caps: a message is at most MAX_MESSAGE_BYTES encoded (bigger ones are refused before
  parsing); nesting deeper than the interpreter's recursion limit is refused. Kafka
  records are much smaller in practice: the claim check (schemas/claimcheck.py) moves
  anything over the inline limit to the blob store.
"""

from __future__ import annotations

import re
import typing
from collections.abc import Iterable, Mapping
from typing import Any, Final, TypeVar, overload

import msgspec

from schemas.envelope import Message
from schemas.messages import ALL_MESSAGES
from schemas.upgrades import UPGRADES, Upgrade

MAX_MESSAGE_BYTES: Final = 64 * 1024 * 1024
"""Largest encoded message the codec writes or reads (claim-check blobs included)."""
_MAX_WHY: Final = 500

T = TypeVar("T", bound=Message)
Buffer = bytes | bytearray | memoryview


class SchemaError(ValueError):
    """Bytes that are not a valid message of a known schema. ``what``: the schema name (or
    "bytes" when not even that is known); ``where``: a field path like ``$.verifier.name``
    or a byte offset; ``why``: the reason. ``str()`` reads "what at where: why"."""

    def __init__(self, what: str, where: str, why: str) -> None:
        super().__init__(what, where, why)
        self.what = what
        self.where = where
        self.why = why

    def __str__(self) -> str:
        return f"{self.what} at {self.where}: {self.why}"


def schema_name(cls: type[Message]) -> str:
    """The wire name (tag) of a message type."""
    return str(cls.__struct_config__.tag)


def _default_version(cls: type[Message]) -> int:
    field = next(f for f in msgspec.structs.fields(cls) if f.name == "v")
    return int(field.default)


def _nested_messages(cls: type[Message]) -> tuple[tuple[str, type[Message]], ...]:
    return tuple(
        (f.name, f.type)
        for f in msgspec.structs.fields(cls)
        if isinstance(f.type, type) and issubclass(f.type, Message)
    )


class Codec:
    """A registry of message types with its encoder and decoders. The module functions use
    the default one (every rollstream message); tests build others."""

    def __init__(
        self,
        types: Iterable[type[Message]],
        upgrades: Mapping[tuple[str, int], Upgrade] | None = None,
        max_bytes: int = MAX_MESSAGE_BYTES,
    ) -> None:
        types = tuple(types)
        self.schemas: dict[str, type[Message]] = {schema_name(t): t for t in types}
        if len(self.schemas) != len(types):
            raise ValueError("two message types share a schema name")
        self.upgrades = upgrades if upgrades is not None else {}
        self.max_bytes = max_bytes
        self._current = {t: _default_version(t) for t in types}
        self._nested = {t: _nested_messages(t) for t in types}
        self._encoder = msgspec.msgpack.Encoder()
        union = typing.Union.__getitem__(types)
        self._any = msgspec.msgpack.Decoder(union)
        self._typed = {t: msgspec.msgpack.Decoder(t) for t in types}
        for name, version in self.upgrades:
            cls = self.schemas.get(name)
            if cls is None or not 1 <= version < self._current[cls]:
                raise ValueError(f"upgrade hook for {name} v{version}: no such older version")

    def current_version(self, cls: type[Message]) -> int:
        return self._current.get(cls) or _default_version(cls)

    # -- encode -----------------------------------------------------------------------

    def encode(self, msg: Message) -> bytes:
        """MessagePack bytes of `msg`; SchemaError for an unregistered type, a value that
        cannot be encoded, or a result over the size cap."""
        cls = type(msg)
        if cls not in self._current:
            raise SchemaError(cls.__name__, "$.schema", "not a registered message schema")
        try:
            data = self._encoder.encode(msg)
        except (TypeError, ValueError, OverflowError) as exc:
            raise SchemaError(cls.__name__, "$", f"cannot encode: {exc}") from None
        if len(data) > self.max_bytes:
            why = f"{len(data)} bytes exceeds the codec cap of {self.max_bytes}"
            raise SchemaError(cls.__name__, "encoded size", why)
        return data

    # -- decode -----------------------------------------------------------------------

    @overload
    def decode(self, data: Buffer, expected: None = None) -> Message: ...
    @overload
    def decode(self, data: Buffer, expected: type[T]) -> T: ...

    def decode(self, data: Buffer, expected: type[Message] | None = None) -> Message:
        """Validate and decode; SchemaError for anything that is not a valid message (of
        type `expected`, when given)."""
        try:
            msg = self._decode(data, expected)
        except SchemaError:
            raise
        except RecursionError:
            raise SchemaError("bytes", "$", "nested too deeply") from None
        except Exception as exc:  # the promise: SchemaError and nothing else
            raise SchemaError("bytes", "$", _why(f"{type(exc).__name__}: {exc}")) from None
        if expected is not None and not isinstance(msg, expected):
            why = f"expected {schema_name(expected)}, got {schema_name(type(msg))}"
            raise SchemaError(schema_name(expected), "$.schema", why)
        return msg

    def validate(self, msg: T) -> T:
        """Check a message built in Python as a reader would (types, constraints); returns
        the decoded copy. For producers that assemble messages from outside input."""
        return self.decode(self.encode(msg), type(msg))

    def _decode(self, data: Buffer, expected: type[Message] | None) -> Message:
        _check_buffer(data, self.max_bytes)
        if expected is not None and expected is not Message and expected not in self._typed:
            raise SchemaError(expected.__name__, "expected", "not a registered message schema")
        decoder = self._typed.get(expected, self._any) if expected else self._any
        try:
            msg: Message = decoder.decode(data)
        except msgspec.ValidationError as exc:
            return self._decode_slow(data, exc, expected)
        except msgspec.DecodeError as exc:
            raise _from_decode_error(exc, len(data)) from None
        return self._settle_versions(msg, data, expected)

    def _settle_versions(
        self, msg: Message, data: Buffer, expected: type[Message] | None
    ) -> Message:
        """Refuse newer versions; upgrade older ones (hooks need the raw map: slow path)."""
        stale: list[tuple[Message, int]] = []
        for path, part in self._parts(msg):
            current = self.current_version(type(part))
            if part.v != current:
                _check_version(schema_name(type(part)), f"{path}.v", part.v, current)
                stale.append((part, current))
        if not stale:
            return msg
        if any(self._has_hooks(type(p), p.v) for p, _ in stale):
            return self._decode_slow(data, None, expected)
        for part, current in stale:
            part.v = current
        return msg

    def _parts(self, msg: Message) -> list[tuple[str, Message]]:
        out = [("$", msg)]
        for name, _cls in self._nested.get(type(msg), ()):
            inner = getattr(msg, name)
            if isinstance(inner, Message):
                out.append((f"$.{name}", inner))
        return out

    def _has_hooks(self, cls: type[Message], version: int) -> bool:
        name = schema_name(cls)
        return any((name, v) in self.upgrades for v in range(version, self.current_version(cls)))

    def _decode_slow(
        self,
        data: Buffer,
        error: msgspec.ValidationError | None,
        expected: type[Message] | None,
    ) -> Message:
        """Raw map path: name the schema, upgrade older versions, or explain the error."""
        raw = _decode_raw(data)
        name, cls = self._identify(raw)
        if expected is not None and expected is not Message and cls is not expected:
            why = f"expected {schema_name(expected)}, got {name}"
            raise SchemaError(schema_name(expected), "$.schema", why)
        upgraded = self._upgrade(raw, cls, "$")
        if not upgraded and error is not None:
            raise _from_validation_error(name, error)
        try:
            return msgspec.convert(raw, cls)
        except msgspec.ValidationError as exc:
            raise _from_validation_error(name, exc) from None

    def _identify(self, raw: Any) -> tuple[str, type[Message]]:
        if not isinstance(raw, dict):
            why = f"expected a map with a `schema` key, got {_kind(raw)}"
            raise SchemaError("bytes", "$", why)
        name = raw.get("schema")
        if not isinstance(name, str):
            why = "missing" if name is None else f"expected a string, got {_kind(name)}"
            raise SchemaError("message", "$.schema", why)
        cls = self.schemas.get(name)
        if cls is None:
            known = ", ".join(sorted(self.schemas))
            raise SchemaError(_short(name), "$.schema", f"unknown schema (known: {known})")
        return name, cls

    def _upgrade(self, raw: dict[str, Any], cls: type[Message], path: str) -> bool:
        """Apply upgrade hooks in place, nested messages included; True if any version
        changed."""
        name = schema_name(cls)
        current = self.current_version(cls)
        version = raw.get("v", current)
        if type(version) is not int:
            raise SchemaError(name, f"{path}.v", f"expected an integer, got {_kind(version)}")
        _check_version(name, f"{path}.v", version, current)
        changed = version != current
        for step in range(version, current):
            hook = self.upgrades.get((name, step))
            if hook is None:
                continue
            try:
                hook(raw)
            except Exception as exc:
                why = _why(f"upgrade v{step} -> v{step + 1} failed: {type(exc).__name__}: {exc}")
                raise SchemaError(name, path, why) from None
        raw["v"] = current
        for field, inner_cls in self._nested.get(cls, ()):
            inner = raw.get(field)
            if isinstance(inner, dict):
                changed |= self._upgrade(inner, inner_cls, f"{path}.{field}")
        return changed


# -- error shaping --------------------------------------------------------------------

_AT = re.compile(r"^(?P<why>.*?) - at `(?P<where>[^`]*)`$", re.DOTALL)
_BYTE = re.compile(r"^(?P<why>.*?) \(byte (?P<offset>\d+)\)$", re.DOTALL)


def _check_buffer(data: object, cap: int) -> None:
    if not isinstance(data, bytes | bytearray | memoryview):
        hint = " (a Kafka tombstone?)" if data is None else ""
        raise SchemaError("bytes", "$", f"expected bytes, got {_kind(data)}{hint}")
    size = data.nbytes if isinstance(data, memoryview) else len(data)
    if size == 0:
        raise SchemaError("bytes", "$", "empty input")
    if size > cap:
        raise SchemaError("bytes", "length", f"{size} bytes exceeds the codec cap of {cap}")


def _check_version(name: str, where: str, version: int, current: int) -> None:
    if version > current:
        why = f"version {version} is newer than this reader knows ({current}); upgrade the reader"
        raise SchemaError(name, where, why)
    if version < 1:
        raise SchemaError(name, where, f"version {version} is not a valid version (>= 1)")


def _decode_raw(data: Buffer) -> Any:
    try:
        return msgspec.msgpack.decode(data)
    except msgspec.DecodeError as exc:
        raise _from_decode_error(exc, len(data)) from None


def _from_validation_error(name: str, exc: msgspec.ValidationError) -> SchemaError:
    text = str(exc)
    match = _AT.match(text)
    if match:
        return SchemaError(name, match["where"], _why(match["why"]))
    return SchemaError(name, "$", _why(text))


def _from_decode_error(exc: msgspec.DecodeError, size: int) -> SchemaError:
    text = str(exc)
    match = _BYTE.match(text)
    if match:
        return SchemaError("bytes", f"byte {match['offset']}", _why(match["why"]))
    if "truncated" in text:
        return SchemaError("bytes", f"byte {size}", "input ends early (truncated)")
    return SchemaError("bytes", "$", _why(text))


def _kind(value: object) -> str:
    names = {dict: "map", list: "array", str: "string", bytes: "bin", type(None): "nil"}
    return names.get(type(value), type(value).__name__)


def _short(text: str, limit: int = 64) -> str:
    return text if len(text) <= limit else text[:limit] + "..."


def _why(text: str) -> str:
    return _short(text, _MAX_WHY)


# -- the default codec ----------------------------------------------------------------

DEFAULT: Final = Codec(ALL_MESSAGES, UPGRADES)
"""Every rollstream message, with the registered upgrade hooks."""
SCHEMAS: Final[dict[str, type[Message]]] = DEFAULT.schemas
"""Schema name -> message type, for every message rollstream reads or writes."""


def encode(msg: Message) -> bytes:
    """MessagePack bytes of a message (see Codec.encode)."""
    return DEFAULT.encode(msg)


@overload
def decode(data: Buffer, expected: None = None) -> Message: ...
@overload
def decode(data: Buffer, expected: type[T]) -> T: ...


def decode(data: Buffer, expected: type[Message] | None = None) -> Message:
    """Validated message from bytes; SchemaError for anything else (see Codec.decode)."""
    return DEFAULT.decode(data, expected)


def validate(msg: T) -> T:
    """Check a message built in Python as a reader would (see Codec.validate)."""
    return DEFAULT.validate(msg)
