"""learner/blobfile.py: a state dict streamed as safetensors, hashed on the way, is the file
`safetensors.torch.save` writes, byte for byte."""

from __future__ import annotations

import hashlib
import io
import random
from pathlib import Path

import pytest
import torch

from learner.blobfile import write_state
from learner.weights import DirWeightStore, path_of, serialize

DTYPES = [
    torch.float64, torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.int32,
    torch.int16, torch.int8, torch.uint8, torch.bool,
]  # fmt: skip


def _random_state(rng: random.Random) -> dict[str, torch.Tensor]:
    state = {}
    for _ in range(rng.randint(0, 8)):
        shape = [rng.randint(0, 3) for _ in range(rng.randint(0, 3))]
        state[f"layer.{rng.randint(0, 99)}.w"] = (torch.randn(shape) * 5).to(rng.choice(DTYPES))
    return state


def test_streamed_blob_is_the_safetensors_file_and_its_hash() -> None:
    rng = random.Random(3)
    for _ in range(300):
        state = _random_state(rng)
        out = io.BytesIO()
        sha, size = write_state(out, state)
        assert out.getvalue() == serialize(state)
        assert size == len(out.getvalue()) and sha == hashlib.sha256(out.getvalue()).hexdigest()


def test_non_contiguous_and_tied_tensors_are_written_by_value() -> None:
    base = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    state = {"t": base.t(), "tied_a": base, "tied_b": base}
    out = io.BytesIO()
    write_state(out, state)
    assert out.getvalue() == serialize({k: v.contiguous().clone() for k, v in state.items()})


def test_unsupported_dtype_is_a_clear_error() -> None:
    with pytest.raises(TypeError, match="complex"):
        write_state(io.BytesIO(), {"z": torch.zeros(2, dtype=torch.complex64)})


def test_dir_store_blob_is_byte_identical_to_the_old_route(tmp_path: Path) -> None:
    state = {"w": torch.randn(64, 8).bfloat16(), "b": torch.randn(8), "step": torch.tensor(3)}
    ref = DirWeightStore(tmp_path, "pi").put(7, state)
    data = path_of(ref.uri).read_bytes()
    assert data == serialize(state) and ref.sha256 == hashlib.sha256(data).hexdigest()
    assert path_of(ref.uri).name == f"v00000007-{ref.sha256[:16]}.safetensors"
    assert [p.name for p in (tmp_path / "pi").iterdir()] == [path_of(ref.uri).name]
