"""Packed little-endian arrays: how token ids, logprobs and policy versions travel.

A packed array is the raw bytes of consecutive fixed-width values, little-endian, with no
header: ``len(data) // 4`` values for int32 and float32. Lists of numbers in MessagePack
cost 1-9 bytes and a type tag per value and a Python object per value on decode; packed
bytes are one ``bin`` field, copied once (see benchmarks/codec.py for the difference).

Other languages: ``struct.pack("<%di" % n, *ids)``, ``np.asarray(x, "<i4").tobytes()``,
``Int32Array`` on a little-endian host, ``binary.LittleEndian`` in Go.
"""

from __future__ import annotations

import sys
from array import array
from collections.abc import Iterable
from typing import Final

I32_SIZE: Final = 4
F32_SIZE: Final = 4

_BIG_ENDIAN: Final = sys.byteorder == "big"


def _int32_typecode() -> str:
    for code in ("i", "l"):
        if array(code).itemsize == I32_SIZE:
            return code
    raise ImportError("no 4-byte integer typecode in the array module on this platform")


_I32: Final = _int32_typecode()
_F32: Final = "f"


def _check_length(data: bytes | bytearray | memoryview, what: str) -> None:
    if len(data) % 4:
        raise ValueError(f"packed {what}: {len(data)} bytes is not a multiple of 4")


def pack_i32(values: Iterable[int]) -> bytes:
    """Pack integers as little-endian int32. Raises ValueError for values outside int32
    or non-integers."""
    try:
        arr = (
            values if isinstance(values, array) and values.typecode == _I32 else array(_I32, values)
        )
    except (OverflowError, TypeError) as exc:
        raise ValueError(f"pack_i32: {exc}") from None
    return _to_le_bytes(arr)


def unpack_i32(data: bytes | bytearray | memoryview) -> array[int]:
    """Unpack little-endian int32 bytes into an ``array('i')`` (list-like, indexable)."""
    _check_length(data, "int32")
    arr = array(_I32)
    arr.frombytes(data)
    if _BIG_ENDIAN:
        arr.byteswap()
    return arr


def pack_f32(values: Iterable[float]) -> bytes:
    """Pack floats as little-endian IEEE-754 float32 (rounded to nearest; magnitudes beyond
    float32 become +-inf). Raises ValueError for non-numbers."""
    try:
        arr = (
            values if isinstance(values, array) and values.typecode == _F32 else array(_F32, values)
        )
    except (OverflowError, TypeError) as exc:
        raise ValueError(f"pack_f32: {exc}") from None
    return _to_le_bytes(arr)


def unpack_f32(data: bytes | bytearray | memoryview) -> array[float]:
    """Unpack little-endian float32 bytes into an ``array('f')`` (list-like, indexable)."""
    _check_length(data, "float32")
    arr = array(_F32)
    arr.frombytes(data)
    if _BIG_ENDIAN:
        arr.byteswap()
    return arr


def count(data: bytes | bytearray | memoryview) -> int:
    """Number of 4-byte values in a packed array."""
    _check_length(data, "array")
    return len(data) // 4


def _to_le_bytes(arr: array[int] | array[float]) -> bytes:
    if _BIG_ENDIAN:
        arr = array(arr.typecode, arr)  # copy: never swap the caller's array in place
        arr.byteswap()
    return arr.tobytes()
