"""Staleness (pure): how many policy versions behind the learner a sample is.

A sample's version is the oldest policy version that sampled any of its tokens (weights
may change mid-episode); when tokens carry no versions, the episode's starting version.
Unknown versions (-1: production traces) have no lag and are never dropped as stale:
they train through the reward-weighted likelihood term instead.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence


def oldest_version(token_versions: Iterable[int], episode_version: int) -> int:
    """The oldest known version of a sample, or -1 when unknown."""
    known = [v for v in token_versions if v >= 0]
    if known:
        return min(known)
    return episode_version if episode_version >= 0 else -1


def lag(current_version: int, sample_version: int) -> int | None:
    """Versions the sample is behind the learner; None when the sample's version is unknown.
    A sample from a version the learner has not reached (after a restart) has lag 0."""
    if sample_version < 0:
        return None
    return max(0, current_version - sample_version)


def stale_reason(sample_lag: int | None, max_lag: int) -> str | None:
    """The ledger reason when the sample must be dropped, else None."""
    if sample_lag is None or sample_lag <= max_lag:
        return None
    return f"stale: lag {sample_lag} > max_lag {max_lag}"


def histogram(lags: Sequence[int | None], max_lag: int) -> dict[str, int]:
    """Counts per lag 0..max_lag, then `>max_lag` and `unknown` (for metrics)."""
    out = {str(k): 0 for k in range(max_lag + 1)}
    out[f">{max_lag}"] = 0
    out["unknown"] = 0
    for value in lags:
        if value is None:
            out["unknown"] += 1
        elif value > max_lag:
            out[f">{max_lag}"] += 1
        else:
            out[str(value)] += 1
    return out
