"""From verdicts to Scores: the sandbox tier's reward map and its in-process verifiers.

- A sandbox result becomes a Score through `sandbox_workers.rewards.reward` (settings
  section `rewards`); sandbox_error becomes a masked Score, never a reward.
- A trajectory whose verifier needs no sandbox (math_answer, exact, regex) is judged here,
  in the dispatcher, by the same plugins the sandbox worker would use, on its completion
  text, and scored through the same map.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

from sandbox_workers import rewards
from sandbox_workers.verifiers import InProcessVerifier, default_registry
from schemas.rollout import Trajectory
from schemas.sandbox import Outcome, SandboxResult
from streams.groups import Score, ScoreInline, ScoreResult

if TYPE_CHECKING:
    from sandbox_workers.config import RewardsSettings


def to_score(
    outcome: Outcome, passed: int, total: int, cfg: RewardsSettings, detail: str = ""
) -> Score:
    """The Score of one verdict under the reward map (masked when the map says None)."""
    value = rewards.reward(outcome, passed, total, cfg)
    if value is None:
        reason = f"{outcome.value}: {detail}" if detail else outcome.value
        return Score(outcome=outcome, passed=passed, total=total, masked=True, mask_reason=reason)
    components = {"pass_fraction": passed / total} if total > 0 else {}
    return Score(outcome=outcome, reward=value, passed=passed, total=total, components=components)


def score_result(cfg: RewardsSettings) -> ScoreResult:
    """Sandbox result -> Score under the `[rewards]` map."""

    def score(result: SandboxResult) -> Score:
        s = to_score(result.outcome, result.passed, result.total, cfg, result.detail)
        s.verifier_name = result.verifier_name
        s.verifier_version = result.verifier_version
        s.image_digest = result.image_digest
        return s

    return score


def score_inline(cfg: RewardsSettings) -> ScoreInline:
    """Trajectory -> Score by its in-process verifier, under the `[rewards]` map."""
    registry = default_registry()
    in_process: dict[int, bool] = {}  # id(plugin) -> isinstance (a slow Protocol check)

    async def score(traj: Trajectory) -> Score:
        plugin, why = registry.lookup(traj.verifier)
        fits = plugin is not None and in_process.get(id(plugin))
        if plugin is not None and fits is None:
            fits = in_process[id(plugin)] = isinstance(plugin, InProcessVerifier)
        if plugin is None or not fits:
            why = why or f"verifier {traj.verifier.name} needs a sandbox"
            return to_score(Outcome.SANDBOX_ERROR, 0, 0, cfg, why)
        verdict = await cast(InProcessVerifier, plugin).judge(traj.completion, traj.verifier)
        s = to_score(verdict.outcome, verdict.passed, verdict.total, cfg, verdict.detail)
        s.verifier_name, s.verifier_version = plugin.name, plugin.version
        return s

    return score
