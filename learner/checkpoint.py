"""Learner checkpoints: model, optimizer, RNG, consumer offsets, policy version, and the
output records (ledger entries, dead letters) whose effect the checkpoint makes durable.
No pickle anywhere.

Layout of one checkpoint, ``{root}/ckpt-{seq:08d}/``:

- ``tensors.safetensors``: ``model/<name>``, ``optim/<param index>/<key>``, ``rng/torch``,
  ``rng/cuda/<device>``.
- ``state.msgpack``: version, step, samples consumed, offsets ``{topic: {partition: next
  offset}}``, the optimizer's param groups and non-tensor state, Python and NumPy RNG
  state, the outbox (topic, key, value of records to send once the checkpoint is durable),
  and free-form ``extra``.
- ``MANIFEST.json``: SHA-256 of the two files above; written last.

It is written into a temporary directory (files fsynced), then renamed into place and the
parent directory fsynced: a checkpoint directory either exists complete or not at all.
Readers take the newest one whose manifest verifies.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import torch
from safetensors.torch import load_file, save_file
from torch import nn

from learner.weights import fsync_dir, write_atomic

_FORMAT = 1
log = logging.getLogger(__name__)


@dataclass
class CheckpointState:
    version: int
    """Policy version of the weights in the checkpoint (the last one published or due)."""
    step: int
    """Optimizer steps taken."""
    samples_consumed: int = 0
    offsets: dict[str, dict[int, int]] = field(default_factory=dict)
    """Next offset to consume, per topic and partition."""
    outbox: list[tuple[str, bytes | None, bytes]] = field(default_factory=list)
    """Records (topic, key, value) about the records consumed since the previous checkpoint:
    ledger entries and dead letters, sent after the checkpoint is written."""
    extra: dict[str, Any] = field(default_factory=dict)
    """msgpack-able extras (the dedup window of trained trajectory ids ...)."""


def _optimizer_split(opt: torch.optim.Optimizer) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    sd = opt.state_dict()
    tensors: dict[str, torch.Tensor] = {}
    scalars: dict[str, dict[str, Any]] = {}
    for idx, st in sd["state"].items():
        for key, value in st.items():
            if torch.is_tensor(value):
                tensors[f"optim/{idx}/{key}"] = value.detach().cpu().contiguous()
            else:
                scalars.setdefault(str(idx), {})[key] = value
    return tensors, {"param_groups": sd["param_groups"], "scalars": scalars}


def _optimizer_join(tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> dict[str, Any]:
    state: dict[int, dict[str, Any]] = {}
    for name, value in tensors.items():
        if name.startswith("optim/"):
            _, idx, key = name.split("/", 2)
            state.setdefault(int(idx), {})[key] = value
    for idx, values in meta["scalars"].items():
        state.setdefault(int(idx), {}).update(values)
    groups = [
        {k: (tuple(v) if isinstance(v, list) and k != "params" else v) for k, v in g.items()}
        for g in meta["param_groups"]
    ]
    return {"state": state, "param_groups": groups}


def _rng_capture() -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    tensors = {"rng/torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        for i, s in enumerate(torch.cuda.get_rng_state_all()):
            tensors[f"rng/cuda/{i}"] = s
    np_state = np.random.get_state(legacy=False)
    np_state["state"]["key"] = np_state["state"]["key"].tolist()
    return tensors, {"python": list(random.getstate()), "numpy": np_state}


def _rng_restore(tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> None:
    torch.set_rng_state(tensors["rng/torch"])
    cuda = [tensors[f"rng/cuda/{i}"] for i in range(torch.cuda.device_count())]
    if torch.cuda.is_available() and all(f"rng/cuda/{i}" in tensors for i in range(len(cuda))):
        torch.cuda.set_rng_state_all(cuda)
    version, internal, gauss = meta["python"]
    random.setstate((version, tuple(internal), gauss))
    np_state = dict(meta["numpy"])
    np_state["state"] = dict(np_state["state"], key=np.array(np_state["state"]["key"], np.uint32))
    np.random.set_state(np_state)


def _sha(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


class CheckpointError(Exception):
    pass


class CheckpointManager:
    def __init__(self, root: str | Path, keep: int = 3) -> None:
        self.root = Path(root)
        self.keep = keep

    def list(self) -> list[Path]:
        """Complete checkpoints, oldest first."""
        if not self.root.is_dir():
            return []
        return sorted(
            p for p in self.root.glob("ckpt-*") if p.is_dir() and (p / "MANIFEST.json").exists()
        )

    def save(self, state: CheckpointState, model: nn.Module, opt: torch.optim.Optimizer) -> Path:
        self.root.mkdir(parents=True, exist_ok=True)
        existing = self.list()
        seq = int(existing[-1].name.split("-")[1]) + 1 if existing else 0
        final = self.root / f"ckpt-{seq:08d}"
        tmp = Path(tempfile.mkdtemp(prefix=".tmp-ckpt-", dir=self.root))
        try:
            opt_tensors, opt_meta = _optimizer_split(opt)
            rng_tensors, rng_meta = _rng_capture()
            model_tensors = {
                f"model/{k}": v.detach().cpu().contiguous().clone()
                for k, v in model.state_dict().items()
            }
            save_file({**model_tensors, **opt_tensors, **rng_tensors}, tmp / "tensors.safetensors")
            meta = {
                "format": _FORMAT,
                "version": state.version,
                "step": state.step,
                "samples_consumed": state.samples_consumed,
                "offsets": {
                    t: {str(p): o for p, o in ps.items()} for t, ps in state.offsets.items()
                },
                "outbox": [list(r) for r in state.outbox],
                "extra": state.extra,
                "optimizer": opt_meta,
                "rng": rng_meta,
            }
            (tmp / "state.msgpack").write_bytes(msgpack.packb(meta, use_bin_type=True))
            for name in ("tensors.safetensors", "state.msgpack"):
                with (tmp / name).open("rb+") as f:
                    os.fsync(f.fileno())
            files = {n: _sha(tmp / n) for n in ("tensors.safetensors", "state.msgpack")}
            write_atomic(tmp / "MANIFEST.json", json.dumps({"files": files}).encode())
            tmp.rename(final)
            fsync_dir(self.root)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        self._prune()
        return final

    def load(
        self, path: Path, model: nn.Module, opt: torch.optim.Optimizer | None
    ) -> CheckpointState:
        """Restore model, optimizer and RNG from `path`; return the rest."""
        manifest = json.loads((path / "MANIFEST.json").read_text())
        for name, sha in manifest["files"].items():
            if _sha(path / name) != sha:
                raise CheckpointError(f"{path / name}: sha256 mismatch (corrupt checkpoint)")
        tensors = load_file(path / "tensors.safetensors")
        meta = msgpack.unpackb(
            (path / "state.msgpack").read_bytes(), raw=False, strict_map_key=False
        )
        if meta.get("format") != _FORMAT:
            raise CheckpointError(f"{path}: unknown checkpoint format {meta.get('format')}")
        model.load_state_dict(
            {k.removeprefix("model/"): v for k, v in tensors.items() if k.startswith("model/")}
        )
        if opt is not None:
            opt.load_state_dict(_optimizer_join(tensors, meta["optimizer"]))
        _rng_restore(tensors, meta["rng"])
        return CheckpointState(
            version=meta["version"],
            step=meta["step"],
            samples_consumed=meta["samples_consumed"],
            offsets={t: {int(p): o for p, o in ps.items()} for t, ps in meta["offsets"].items()},
            outbox=[(t, k, v) for t, k, v in meta["outbox"]],
            extra=meta["extra"],
        )

    def load_latest(
        self, model: nn.Module, opt: torch.optim.Optimizer | None
    ) -> tuple[Path, CheckpointState] | None:
        """The newest checkpoint that verifies (older ones if the newest is corrupt)."""
        for path in reversed(self.list()):
            try:
                return path, self.load(path, model, opt)
            except (CheckpointError, OSError, ValueError, KeyError) as exc:
                log.warning("skipping checkpoint %s: %s: %s", path, type(exc).__name__, exc)
        return None

    @staticmethod
    def mark_flushed(path: Path) -> None:
        """Record that the checkpoint's outbox is sent and its offsets committed."""
        write_atomic(path / "FLUSHED", b"")

    @staticmethod
    def is_flushed(path: Path) -> bool:
        return (path / "FLUSHED").exists()

    def _prune(self) -> None:
        for old in self.list()[: -self.keep]:
            shutil.rmtree(old, ignore_errors=True)
        for stale in self.root.glob(".tmp-ckpt-*"):  # left by a crash mid-save
            shutil.rmtree(stale, ignore_errors=True)
