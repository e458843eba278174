"""Publishing weights: a snapshot between two training steps (in the publish dtype), then
the blob to the store and the `WeightUpdate` on `weights`, which learner/loop.py runs in
the background while training goes on."""

from __future__ import annotations

import asyncio
from typing import Any

import torch
from torch import Tensor

from learner.io import LearnerIO
from learner.weights import WeightStore
from schemas import codec
from schemas.messages import WeightUpdate

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def cast_state(state: dict[str, Tensor], dtype: str) -> dict[str, Tensor]:
    """Floating-point tensors in ``dtype`` (`float32` | `bfloat16`); others as they are."""
    want = DTYPES[dtype]
    return {k: v.to(want) if v.is_floating_point() else v for k, v in state.items()}


def snapshot(source: Any, dtype: str) -> dict[str, Tensor]:
    """`source.weights()` (a policy or trainer) now, cast for publishing (a copy)."""
    return cast_state(source.weights(), dtype)


async def store_and_announce(
    store: WeightStore,
    io: LearnerIO,
    cfg: Any,
    state: dict[str, Tensor],
    *,
    version: int,
    step: int,
    samples_consumed: int,
) -> WeightUpdate:
    """The blob first (complete, sha256), then its announcement."""
    ref = await asyncio.to_thread(store.put, version, state)
    update = WeightUpdate(
        policy=cfg.policy,
        version=version,
        step=step,
        uri=ref.uri,
        sha256=ref.sha256,
        size_bytes=ref.size_bytes,
        samples_consumed=samples_consumed,
    )
    await io.send_and_wait(cfg.weights_topic, value=codec.encode(update), key=cfg.policy.encode())
    return update
