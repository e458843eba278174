"""The policy factory: which architecture the `[learner]` section describes, and building it.

The public API for every process that must build the model the learner trains (the
learner itself, the generators, the demo's warm-up, the ingest tokenizer): a JSON-able
spec (`policy_spec`, also what `Policy.spec()` returns and weight announcements imply) and
`build_policy(spec)`. This module imports the backends (learner/tiny.py, learner/hf.py);
they import only learner/policy.py, so there is no cycle.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from learner.config import LearnerSettings
from learner.policy import Policy
from learner.tiny import TinyConfig, TinyPolicy


def policy_spec(section: LearnerSettings) -> dict[str, Any]:
    """The architecture the section describes (generators build the same with it)."""
    if section.model == "tiny":
        cfg = TinyConfig(
            dim=section.tiny_dim,
            layers=section.tiny_layers,
            heads=section.tiny_heads,
            max_seq_len=section.max_seq_len,
        )
        return cfg.to_dict()
    lora = None
    if section.lora_rank > 0:
        lora = {"rank": section.lora_rank, "alpha": section.lora_alpha,
                "targets": list(section.lora_targets)}  # fmt: skip
    return {"kind": "hf", "path": section.model, "dtype": section.hf_dtype,
            "sample_dtype": section.sample_dtype, "lora": lora,
            "sample_compile": section.sample_compile}  # fmt: skip


def build_policy(spec: Mapping[str, Any]) -> Policy:
    """Build a policy from `Policy.spec()` output: ``{"kind": "tiny", ...}`` or
    ``{"kind": "hf", "path": ...}``."""
    kind = spec.get("kind")
    if kind == "tiny":
        return TinyPolicy(TinyConfig.from_dict(spec))
    if kind == "hf":
        from learner.hf import HFPolicy, LoraSpec  # transformers only when a HF model is used

        lora = spec.get("lora")
        return HFPolicy.from_path(
            spec["path"],
            dtype=spec.get("dtype"),
            sample_dtype=spec.get("sample_dtype"),
            sample_compile=bool(spec.get("sample_compile", False)),
            lora=None
            if not lora
            else LoraSpec(lora["rank"], lora["alpha"], tuple(lora["targets"])),
        )
    raise ValueError(f"unknown policy kind {kind!r} (expected 'tiny' or 'hf')")


def make_policy(section: LearnerSettings) -> Policy:
    """The initial policy: seeded init for `tiny`, the saved weights for a HF directory."""
    torch.manual_seed(section.seed)
    return build_policy(policy_spec(section))
