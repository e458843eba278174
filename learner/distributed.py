"""torch.distributed plumbing of the data-parallel learner: the process group, and a channel
from rank 0 to every rank that carries commands, batches and state as tensors (no pickle).

The environment is torchrun's: RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT
(`rollstream learner --nproc N` sets the same for the processes it starts). The backend is
gloo on the CPU and nccl on CUDA; every rank on CUDA uses the device `cuda:LOCAL_RANK`.

Rank 0 alone talks to Kafka, Redis and the checkpoint directory (learner/parallel.py has
the design); it drives the other ranks through a `Channel`: a command is a broadcast int64
header ``[op, *args]``, followed by the tensors the command needs. A batch travels packed:
per-sample lengths and flags, the tokens, advantages and rewards, behaviour logprobs and
train masks, each concatenated into one tensor. Every rank receives the whole global batch
(a few hundred kB at most) and takes its share by `shard`, which every rank computes alike.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from enum import IntEnum
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import Tensor

from learner.sample import Sample

TIMEOUT = timedelta(days=7)
"""Collective timeout: the other ranks wait in a broadcast for as long as rank 0 waits for
rewards, which can be long; a dead rank is noticed by the launcher (--nproc or torchrun),
which ends the others."""
_HEADER = 8


class Op(IntEnum):
    """Commands from rank 0."""

    STOP = 0
    TRAIN = 1
    WEIGHTS = 2
    """Gather the full weights onto rank 0 (FSDP)."""
    SAVE = 3
    """Gather the full model and optimizer state onto rank 0 (FSDP)."""
    LOAD = 4
    """Rank 0 restored a checkpoint: take its state."""


@dataclass(frozen=True)
class DistEnv:
    """This process's place in the job (torchrun's environment variables)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> DistEnv:
        env = os.environ if environ is None else environ
        world = int(env.get("WORLD_SIZE", "1"))
        rank = int(env.get("RANK", "0"))
        if world < 1 or not 0 <= rank < world:
            raise ValueError(f"bad torch.distributed environment: RANK={rank} WORLD_SIZE={world}")
        return cls(rank, world, int(env.get("LOCAL_RANK", str(rank))))

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def rank_device(device: torch.device, env: DistEnv) -> torch.device:
    """The device of this rank: `cuda` without an index becomes `cuda:LOCAL_RANK`."""
    if device.type == "cuda" and device.index is None and env.distributed:
        return torch.device("cuda", env.local_rank)
    return device


def init_process_group(env: DistEnv, device: torch.device) -> None:
    """Join the job's process group (env:// rendezvous), gloo on CPU, nccl on CUDA."""
    if dist.is_initialized():
        return
    backend = "nccl" if device.type == "cuda" else "gloo"
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend, rank=env.rank, world_size=env.world_size, timeout=TIMEOUT)


def shutdown() -> None:
    """Leave the process group: a barrier first, so that no rank tears its communicators
    down while another still talks (rank 0 hosts the rendezvous store)."""
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def shard(lengths: Sequence[int], world: int) -> list[list[int]]:
    """Deterministic split of item indices over `world` ranks, balanced by tokens: longest
    first, each to the rank with the fewest tokens so far (ties: the lower rank); each
    rank's indices in ascending order."""
    load = [0] * world
    parts: list[list[int]] = [[] for _ in range(world)]
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        r = min(range(world), key=lambda r: (load[r], r))
        parts[r].append(i)
        load[r] += lengths[i]
    return [sorted(p) for p in parts]


def pack(samples: Sequence[Sample]) -> list[Tensor]:
    """Samples as five tensors: meta [n, 4] int64 (prompt length, completion length, has a
    train mask, has behaviour logprobs), tokens int32, [n, 2] float32 (advantage, reward),
    behaviour logprobs float32, train masks uint8 (the last three concatenated)."""
    meta = [
        [len(s.prompt), len(s.completion), s.train_mask is not None, s.behaviour_logp is not None]
        for s in samples
    ]
    tokens = [np.concatenate([s.prompt, s.completion]).astype(np.int32) for s in samples]
    logp = [s.behaviour_logp for s in samples if s.behaviour_logp is not None]
    masks = [s.train_mask for s in samples if s.train_mask is not None]
    return [
        torch.tensor(meta, dtype=torch.int64).reshape(-1, 4),
        torch.from_numpy(np.concatenate(tokens or [np.zeros(0, np.int32)])),
        torch.tensor([[s.advantage, s.reward] for s in samples], dtype=torch.float32).reshape(
            -1, 2
        ),
        torch.from_numpy(np.concatenate(logp or [np.zeros(0, np.float32)]).astype(np.float32)),
        torch.from_numpy(np.concatenate(masks or [np.zeros(0, bool)]).astype(np.uint8)),
    ]


def unpack(parts: Sequence[Tensor]) -> list[Sample]:
    """The inverse of `pack` (ids, versions and origins stay behind on rank 0)."""
    meta, tokens, floats, logp, masks = (t.cpu().numpy() for t in parts)
    out: list[Sample] = []
    at = lp = mk = 0
    for i, (p, c, has_mask, has_b) in enumerate(meta.tolist()):
        seq = tokens[at : at + p + c]
        at += p + c
        sample = Sample("", "", seq[:p].copy(), seq[p:].copy(), float(floats[i, 0]))
        sample.reward = float(floats[i, 1])
        if has_b:
            sample.behaviour_logp, lp = logp[lp : lp + c].copy(), lp + c
        if has_mask:
            sample.train_mask, mk = masks[mk : mk + c].astype(bool), mk + c
        out.append(sample)
    return out


class Channel:
    """Rank 0 -> every rank, by broadcast on the default process group."""

    def __init__(self, device: torch.device) -> None:
        self.device = device if dist.get_backend() == "nccl" else torch.device("cpu")

    def _bcast(self, t: Tensor) -> Tensor:
        t = t.to(self.device)
        dist.broadcast(t, src=0)
        return t

    def command(self, op: Op, *args: int) -> None:
        header = torch.zeros(_HEADER, dtype=torch.int64)
        header[0], header[1 : 1 + len(args)] = int(op), torch.tensor(args, dtype=torch.int64)
        self._bcast(header)

    def receive(self) -> tuple[Op, list[int]]:
        header = self._bcast(torch.zeros(_HEADER, dtype=torch.int64)).cpu().tolist()
        return Op(header[0]), header[1:]

    def send_batch(self, samples: Sequence[Sample]) -> None:
        parts = pack(samples)
        self.command(Op.TRAIN, *(t.numel() for t in parts))
        for t in parts:
            self._bcast(t)

    def receive_batch(self, sizes: Sequence[int]) -> list[Sample]:
        """After a TRAIN command: the batch."""
        dtypes = (torch.int64, torch.int32, torch.float32, torch.float32, torch.uint8)
        parts = [
            self._bcast(torch.empty(n, dtype=d)).cpu() for n, d in zip(sizes, dtypes, strict=False)
        ]
        parts[0], parts[2] = parts[0].reshape(-1, 4), parts[2].reshape(-1, 2)
        return unpack(parts)

    def json(self, value: Any = None) -> Any:
        """Broadcast a JSON-able value from rank 0 (others pass nothing); every rank gets it."""
        data = json.dumps(value).encode() if dist.get_rank() == 0 else b""
        n = int(self._bcast(torch.tensor([len(data)], dtype=torch.int64)).item())
        buf = torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else None
        got = self._bcast(buf if buf is not None else torch.empty(n, dtype=torch.uint8))
        return json.loads(bytes(got.cpu().numpy().tobytes()).decode())

    def tensors(self, values: Mapping[str, Tensor] | None = None) -> dict[str, Tensor]:
        """Broadcast named tensors from rank 0 (names, dtypes and shapes as JSON first)."""
        spec = None
        if values is not None:
            spec = [
                [k, str(v.dtype).removeprefix("torch."), list(v.shape)] for k, v in values.items()
            ]
        spec = self.json(spec)
        out: dict[str, Tensor] = {}
        for name, dtype, shape in spec:
            src = values[name] if values is not None else None
            t = src if src is not None else torch.empty(shape, dtype=getattr(torch, dtype))
            out[name] = self._bcast(t.contiguous()).cpu()
        return out
