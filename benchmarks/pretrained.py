"""The pretrained model a SmolLM2-size benchmark runs on: the named preset (or any
`learner.model` form) resolved from the stack's cache, loaded in float32 on ``threads``."""

from __future__ import annotations

import torch

from learner.hf import HFPolicy


def load_pretrained(model: str, threads: int) -> HFPolicy:
    torch.set_num_threads(threads)
    from services.infra.models import resolve
    from services.settings import load

    path = resolve(model, load().stack.cache_dir)
    if path is None:
        raise SystemExit(f"{model!r}: these benchmarks need a pretrained model, not tiny")
    return HFPolicy.from_path(path, dtype="float32")
