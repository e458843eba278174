"""The reward map: a sandbox outcome -> a reward, or None (masked). Pure functions.

Defaults (settings section `rewards`, services/settings.py):

| outcome        | reward (mode `fraction`)                     | mode `all_pass` |
|----------------|----------------------------------------------|-----------------|
| passed         | passed = 1.0                                 | 1.0             |
| failed         | failed + (passed - failed) * k/n = k/n       | failed = 0.0    |
| compile_error  | -0.5                                         | -0.5            |
| runtime_error  | -0.25                                        | -0.25           |
| timeout        | -0.25                                        | -0.25           |
| memory_limit   | -0.25                                        | -0.25           |
| output_limit   | -0.25                                        | -0.25           |
| tamper         | -1.0 (the lowest, always)                    | -1.0            |
| sandbox_error  | None: masked, never a reward                 | None            |

The settings validator keeps the order that makes the map honest: no failure mode of the
model earns more than an honest wrong answer (`failed`), and tamper earns least.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from schemas.sandbox import Outcome

if TYPE_CHECKING:
    from sandbox_workers.config import RewardsSettings

PENALIZED = (
    Outcome.COMPILE_ERROR,
    Outcome.RUNTIME_ERROR,
    Outcome.TIMEOUT,
    Outcome.MEMORY_LIMIT,
    Outcome.OUTPUT_LIMIT,
    Outcome.TAMPER,
)


def reward(outcome: Outcome, passed: int, total: int, cfg: RewardsSettings) -> float | None:
    """The reward of one result; None means masked (sandbox_error: the infrastructure's
    fault, retried upstream and then left out of training)."""
    if outcome == Outcome.SANDBOX_ERROR:
        return None
    if outcome == Outcome.PASSED:
        return cfg.passed
    if outcome == Outcome.FAILED:
        if cfg.mode == "all_pass" or total <= 0:
            return cfg.failed
        frac = min(max(passed, 0), total) / total
        return cfg.failed + (cfg.passed - cfg.failed) * frac
    return float(getattr(cfg, outcome.value))
