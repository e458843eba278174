"""Synthetic ScoredTrajectory messages for tests, benchmarks and smoke runs."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np

from schemas.arrays import pack_f32, pack_i32
from schemas.messages import Outcome, ScoredTrajectory, Trajectory, VerifierSpec


def scored(
    prompt: Sequence[int],
    completion: Sequence[int],
    *,
    advantage: float,
    reward: float = 0.0,
    logprobs: Sequence[float] | None = None,
    version: int = 0,
    group_id: str = "g",
    group_size: int = 1,
    index: int = 0,
    masked: bool = False,
) -> ScoredTrajectory:
    """One scored trajectory; `logprobs=None` makes it a production trace (no behaviour)."""
    traj = Trajectory(
        task_id="synthetic",
        group_id=group_id,
        group_size=group_size,
        index=index,
        prompt_tokens=pack_i32(prompt),
        completion_tokens=pack_i32(completion),
        behaviour_logprobs=pack_f32(logprobs) if logprobs is not None else None,
        policy_versions=pack_i32([version] * len(completion)) if version >= 0 else b"",
        policy_version=version,
        verifier=VerifierSpec(name="exact", answer="", needs_sandbox=False),
    )
    return ScoredTrajectory(
        trajectory=traj,
        reward=reward,
        advantage=advantage,
        outcome=Outcome.SANDBOX_ERROR if masked else Outcome.PASSED,
        masked=masked,
        mask_reason="sandbox_error after 3 attempts" if masked else "",
    )


def random_groups(
    n_groups: int,
    *,
    group_size: int = 4,
    prompt_len: int = 16,
    completion_len: int = 48,
    vocab: int = 256,
    version: int = 0,
    seed: int = 0,
) -> Iterator[ScoredTrajectory]:
    """Groups of random token sequences with plausible logprobs and centred advantages."""
    rng = np.random.default_rng(seed)
    for g in range(n_groups):
        prompt = rng.integers(0, vocab, prompt_len).tolist()
        rewards = rng.random(group_size)
        for i in range(group_size):
            yield scored(
                prompt,
                rng.integers(0, vocab, completion_len).tolist(),
                advantage=float(rewards[i] - rewards.mean()),
                reward=float(rewards[i]),
                logprobs=(-rng.random(completion_len) * 6).tolist(),
                version=version,
                group_id=f"s{seed}-g{g}",
                group_size=group_size,
                index=i,
            )
