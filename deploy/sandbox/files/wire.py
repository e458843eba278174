"""Plain-data wire format between the trusted test harness and the candidate's process.

Standard library only (runs inside the sandbox image). Frames are a 4-byte big-endian
length then UTF-8 JSON. Values travel as a tagged JSON tree that can only describe
plain data: None, bool, int, float, complex, str, bytes, bytearray, list, tuple, set,
frozenset, dict, plus opaque handles to objects that stay in the candidate's process.
Decoding builds only builtin types (exact types, never subclasses), so nothing the
candidate sends can carry behaviour (an `__eq__` that always says yes, say) into the
harness. The decoder is defensive: size cap, depth cap, and every malformed input is a
WireError.
"""

from __future__ import annotations

import base64
import json
import os
import struct

MAX_FRAME = 16 << 20
"""Largest frame either side accepts (a bigger one is a protocol violation)."""
MAX_DEPTH = 400
"""Deepest nesting of a value."""
_SAFE_INT = 1 << 53
_HEADER = struct.Struct(">I")


class WireError(Exception):
    """Malformed, oversized or unexpected data on the wire."""


class ChannelClosed(WireError):
    """The other side closed its end (it exited or was killed)."""


class Handle:
    """An object that stays in the candidate's process, named by a number."""

    __slots__ = ("hid", "kind", "text")

    def __init__(self, hid: int, kind: str, text: str) -> None:
        self.hid = hid
        self.kind = kind
        self.text = text


def encode(value, handles=None, depth=0):
    """A JSON-able tree for `value`. Objects that are not plain data become handles when
    `handles` (a callable object -> Handle) is given, else raise TypeError."""
    if depth > MAX_DEPTH:
        raise ValueError("value nested too deeply to send")
    t = type(value)
    if value is None or t is bool or t is str:
        return value
    if t is int:
        return value if -_SAFE_INT < value < _SAFE_INT else {"x": format(value, "x")}
    if t is float:
        return {"f": value.hex()}
    d = depth + 1
    if t is list:
        return {"l": [encode(v, handles, d) for v in value]}
    if t is tuple:
        return {"t": [encode(v, handles, d) for v in value]}
    if t is dict:
        return {"d": [[encode(k, handles, d), encode(v, handles, d)] for k, v in value.items()]}
    if t is set or t is frozenset:
        return {"s" if t is set else "fs": [encode(v, handles, d) for v in value]}
    if t is bytes or t is bytearray:
        return {"b" if t is bytes else "ba": base64.b64encode(value).decode("ascii")}
    if t is complex:
        return {"c": [value.real.hex(), value.imag.hex()]}
    if handles is None:
        raise TypeError(f"cannot send a {t.__name__} to the candidate: only plain data")
    h = handles(value)
    return {"h": h.hid, "k": h.kind, "r": h.text}


def decode(tree, make_handle=None, depth=0):
    """Plain builtin values from a tree made by `encode`. Handles become
    `make_handle(Handle)` when given, else are refused."""
    if depth > MAX_DEPTH:
        raise WireError("value nested too deeply")
    if tree is None or type(tree) in (bool, str):
        return tree
    if type(tree) is int:
        if not -_SAFE_INT < tree < _SAFE_INT:
            raise WireError("bare integer out of range")
        return tree
    if type(tree) is not dict or len(tree) not in (1, 3):
        raise WireError(f"unexpected {type(tree).__name__} in a value")
    tag = next(iter(tree))
    body = tree[tag]
    d = depth + 1
    try:
        if tag == "x":
            return int(_str(body), 16)
        if tag == "f":
            return float.fromhex(_str(body))
        if tag in ("l", "t", "s", "fs"):
            items = [decode(v, make_handle, d) for v in _list(body)]
            return {"l": list, "t": tuple, "s": set, "fs": frozenset}[tag](items)
        if tag == "d":
            pairs = _list(body)
            out = {}
            for pair in pairs:
                if type(pair) is not list or len(pair) != 2:
                    raise WireError("malformed dict item")
                out[decode(pair[0], make_handle, d)] = decode(pair[1], make_handle, d)
            return out
        if tag in ("b", "ba"):
            raw = base64.b64decode(_str(body), validate=True)
            return raw if tag == "b" else bytearray(raw)
        if tag == "c":
            re_, im = _list(body)
            return complex(float.fromhex(_str(re_)), float.fromhex(_str(im)))
        if tag == "h" and make_handle is not None and len(tree) == 3:
            hid, kind, text = body, tree.get("k"), tree.get("r")
            if type(hid) is not int or type(kind) is not str or type(text) is not str:
                raise WireError("malformed handle")
            return make_handle(Handle(hid, kind[:20], text[:200]))
    except WireError:
        raise
    except (TypeError, ValueError, OverflowError) as exc:  # unhashable key, bad hex, ...
        raise WireError(f"malformed {tag!r} value: {type(exc).__name__}: {exc}") from None
    raise WireError(f"unknown value tag {tag!r}")


def _str(x):
    if type(x) is not str:
        raise WireError("expected a string")
    return x


def _list(x):
    if type(x) is not list:
        raise WireError("expected a list")
    return x


def send(fd, obj):
    """Write one frame (blocking, whole)."""
    data = json.dumps(obj, separators=(",", ":"), allow_nan=False).encode("utf-8")
    if len(data) > MAX_FRAME:
        raise WireError(f"frame of {len(data)} bytes is over the {MAX_FRAME} byte limit")
    view = memoryview(_HEADER.pack(len(data)) + data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def _read_exact(fd, n):
    chunks = []
    while n:
        chunk = os.read(fd, min(n, 1 << 20))
        if not chunk:
            raise ChannelClosed("the other side closed the channel")
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def recv(fd):
    """Read one frame and parse its JSON (WireError on anything malformed)."""
    (size,) = _HEADER.unpack(_read_exact(fd, 4))
    if size > MAX_FRAME:
        raise WireError(f"frame of {size} bytes is over the {MAX_FRAME} byte limit")
    try:
        return json.loads(_read_exact(fd, size).decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise WireError(f"malformed frame: {type(exc).__name__}") from None
