"""Writing a state dict as a safetensors file in one pass, hashing it on the way.

`safetensors.torch.save` builds the whole file as one bytes object (a copy of every
tensor) that the store then hashes and writes: three passes over a 326 MB SmolLM2 blob.
`write_state` streams the same format to a file object (the header, then each tensor's
bytes straight from its memory) and feeds the SHA-256 as it goes, so the store writes and
hashes in one pass with no copy. The file is a standard safetensors file: any reader
(`safetensors.torch.load_file`, other languages) loads it, and its hash is the hash of the
file's bytes, which readers verify as before. The bytes are those `safetensors.torch.save`
writes for the same state (same order and header), so a blob's hash does not change.

Format (https://github.com/huggingface/safetensors): 8 bytes little-endian header length
N, N bytes of JSON (``{"__metadata__": {...}, name: {"dtype", "shape", "data_offsets"}}``,
padded with spaces to a multiple of 8), then the tensors' bytes back to back, each at its
``data_offsets`` relative to the end of the header.
"""

from __future__ import annotations

import hashlib
import json
import struct
from collections.abc import Mapping
from typing import BinaryIO

import torch
from torch import Tensor

DTYPES = {
    torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
    torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8",
    torch.uint8: "U8", torch.bool: "BOOL",
}  # fmt: skip


def _flat(t: Tensor) -> Tensor:
    """The tensor's bytes as a 1-D uint8 view (a contiguous CPU copy only where needed)."""
    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    return t.contiguous().reshape(-1).view(torch.uint8)


RANK = {name: i for i, name in enumerate(("BOOL", "U8", "I8", "I16", "F16", "BF16", "I32", "F32",
                                          "F64", "I64"))}  # fmt: skip
"""safetensors' Dtype enum order (of the dtypes above)."""


def order(state: Mapping[str, Tensor]) -> list[str]:
    """The order safetensors lays tensors out in: by dtype, last in its enum first, then by
    name."""
    bad = [f"{name} ({t.dtype})" for name, t in state.items() if t.dtype not in DTYPES]
    if bad:
        raise TypeError(f"no safetensors dtype for {', '.join(bad[:3])}")
    return sorted(state, key=lambda name: (-RANK[DTYPES[state[name].dtype]], name))


def header(state: Mapping[str, Tensor], names: list[str], metadata: Mapping[str, str]) -> bytes:
    """The length prefix and JSON header of `state`, its tensors laid out in `names` order
    (`order`)."""
    entries: dict[str, object] = {"__metadata__": dict(metadata)}
    offset = 0
    for name in names:
        t = state[name]
        size = t.numel() * t.element_size()
        span = [offset, offset + size]
        entries[name] = {"dtype": DTYPES[t.dtype], "shape": list(t.shape), "data_offsets": span}
        offset += size
    text = json.dumps(entries, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text


def write_state(
    f: BinaryIO, state: Mapping[str, Tensor], metadata: Mapping[str, str] | None = None
) -> tuple[str, int]:
    """Write `state` to `f` as safetensors; returns (sha256 hex of the bytes written, size)."""
    digest = hashlib.sha256()
    names = order(state)
    head = header(state, names, metadata or {"format": "pt"})
    digest.update(head)
    f.write(head)
    size = len(head)
    for name in names:
        data = _flat(state[name]).numpy()  # shares the tensor's memory
        digest.update(data.data)
        f.write(data.data)
        size += data.nbytes
    return digest.hexdigest(), size
