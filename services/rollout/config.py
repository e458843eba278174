"""Settings sections owned by the rollout services: `[generator]` and `[feeder]`."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator

from services.config import Section, _parse_text_fields


class GeneratorSettings(Section):
    """Rollout generators (`rollstream generator`, services/rollout/, DESIGN.md section 7).
    The sampling temperature is `learner.temperature`: the learner divides logits by the
    same number, so behaviour and learner logprobs describe one distribution."""

    top_p: float = Field(default=1.0, gt=0, le=1)
    """Nucleus sampling: keep the smallest set of tokens holding this much probability."""
    max_new_tokens: int = Field(default=64, ge=1)
    """Tokens sampled per assistant turn at most (finish_reason `length` when reached)."""
    max_turns: int = Field(default=4, ge=1, le=256)
    """Cap on a task's `max_turns` (multi-turn episodes through the sandbox tier, tool
    calling)."""
    turn_timeout_s: float = Field(default=60.0, gt=0)
    """Multi-turn: how long a turn waits for its sandbox result before the episode ends
    there (finish_reason `turn_timeout`)."""
    observation_chars: int = Field(default=400, ge=0)
    """Multi-turn and tool calling: most characters of a sandbox verdict or a tool's result
    appended as the observation."""
    environments: list[str] = Field(default_factory=list)
    """Python modules imported when the generator starts, each registering its episode
    environments with `services.rollout.episodes.register` (README: Adding an
    environment)."""
    pacing: bool = True
    """Admission control: stay at most (learner.max_lag + 1) x batch trajectories ahead of
    the learner's settled count announced on `progress` (services/rollout/pacing.py)."""
    batch_samples: int | None = Field(default=None, ge=1)
    """Trajectories per learner batch, for pacing. Unset: learner.batch_tokens divided by
    the mean length (prompt + completion tokens) of the trajectories sampled so far."""
    inflight_updates: bool = True
    """Adopt newer verified weights between two decoding steps of a running batch (as
    PipelineRL), not only between sequences; each token records the version whose logits
    it was drawn from (Trajectory.policy_versions)."""
    first_weights_timeout_s: float = Field(default=0.0, ge=0)
    """How long to wait for the first weights announcement before giving up (0: forever)."""
    torch_threads: int = Field(default=1, ge=1)
    """CPU threads torch may use for sampling."""
    seed: int | None = None
    """Seed of the sampling RNG. Unset: fresh entropy per process."""
    generator_id: str | None = None
    """Name of this generator in trajectories and logs. Unset: host:pid."""
    metrics_port: int = Field(default=0, ge=0, le=65535)
    """Prometheus metrics on 127.0.0.1:PORT (0: off)."""

    @model_validator(mode="before")
    @classmethod
    def _text_forms(cls, data: Any) -> Any:
        return _parse_text_fields(data, maps=(), lists=("environments",))


class FeederSettings(Section):
    """The task feeder (`rollstream feeder`, services/rollout/feeder.py)."""

    suites: dict[str, float] = Field(default_factory=lambda: {"arith": 0.85, "pyfunc": 0.15})
    """Sampling weight per suite: built-in suites (services/suites/) and the suites named
    by tasks in `task_files`. A suite of the task files missing here gets weight 1."""
    task_files: list[Path] = Field(default_factory=list)
    """JSONL files of tasks (one Task object per line, see services/rollout/admission.py)."""
    group_size: int = Field(default=8, ge=1, le=4096)
    """Completions per task of the built-in suites (task files carry their own)."""
    max_turns: int = Field(default=1, ge=1, le=256)
    """Turn budget of the built-in code tasks (1: single completion; >1: multi-turn)."""
    rate: float = Field(default=0.0, ge=0)
    """Tasks per second at most (0: no limit; `max_backlog` still applies)."""
    max_backlog: int = Field(default=16, ge=1)
    """Tasks published but not yet taken by the generators' consumer group, at most."""
    max_sandbox_backlog: int = Field(default=16, ge=0)
    """While the sandbox tier has more requests than this waiting (published minus those the
    sandbox workers' commits account for: below the committed offsets or marked answered
    past them, schemas/answered.py), suites whose verifier runs in the sandbox are not
    sampled: their samples would only queue and reach the learner too stale to train on.
    0: no limit."""
    sandbox_backpressure: Literal["suites", "all"] = "suites"
    """What pauses while the sandbox tier is past `max_sandbox_backlog`. `suites`: only the
    suites verified in the sandbox (the others keep flowing at full speed, so the training
    mix leans towards them). `all`: every suite, so the mix stays as weighted and the whole
    pipeline runs at the sandbox tier's pace."""
    max_tasks: int = Field(default=0, ge=0)
    """Stop after publishing this many tasks (0: run until stopped)."""
    check_references: bool = True
    """Admission: a task's reference solution must pass its own verifier (in-process, or
    through the sandbox tier for sandboxed verifiers) before the task is fed."""
    reference_timeout_s: float = Field(default=120.0, gt=0)
    """How long a reference check waits for its sandbox result; then the task is rejected."""
    adapt: bool = False
    """Adapt suite weights from observed rewards: suites whose groups all pass or all fail
    (no learning signal) are sampled less."""
    adapt_floor: float = Field(default=0.2, gt=0, le=1)
    """With `adapt`: the smallest multiplier a suite's weight or a task's chance can get;
    with `frontier` the smallest chance it gives a task."""
    adapt_suites: bool = True
    """With `adapt`: suite weights move too. False: only the tasks whose groups' rewards were
    all equal are skipped more often, and the suites keep their weighted mix (the suite the
    model does best on keeps its share of samples)."""
    frontier: bool = False
    """With `calibration`: take each task, when its turn comes, by the chance that its group's
    rewards differ (services/rollout/frontier.py). Its pass rate now is its calibrated one
    moved by one shift on the logit scale shared by every task, fitted to the rewards of the
    recent groups; a task the policy now always (or never) solves is skipped, down to a
    chance of `adapt_floor`. Unlike `adapt`'s per-task history this reaches tasks never
    drawn before, which over a large pool is most of them."""
    seed: int = 0
    """Seed of suite and task sampling."""
    calibration: str | None = None
    """Per-task pass rates of the model (services/suites/calibration.py): a file written
    by `rollstream calibrate`, or the name of one shipped in services/suites/data/
    (`smollm2-code`: SmolLM2-135M-Instruct on the code suite's train split at temperature
    0.7). Tasks measured outside `pass_band` are not fed. Unset: every task is fed."""
    pass_band: tuple[float, float] = (0.05, 0.95)
    """With `calibration`: the measured pass rates (inclusive) of the tasks that are fed.
    A group teaches only when its samples disagree, so tasks the model (almost) never
    solves are left out; tasks never measured are fed."""
    family_max: int = Field(default=0, ge=0)
    """Most members fed of each task family (metadata `family`: one function with other
    constants), those measured nearest a 0.5 pass rate first; 0: every member."""
    skip_greedy_solved: bool = False
    """With `calibration`: leave out the tasks whose greedy completion it records as
    passing. At a sampling temperature below 1 RL mostly sharpens the policy towards its
    most likely answer, which on such a task already passes: it cannot raise greedy pass@1
    there, only on tasks greedy decoding fails and sampling sometimes solves."""

    @model_validator(mode="before")
    @classmethod
    def _text_forms(cls, data: Any) -> Any:
        return _parse_text_fields(data, maps=("suites",), lists=("task_files", "pass_band"))

    @model_validator(mode="after")
    def _band(self) -> FeederSettings:
        lo, hi = self.pass_band
        if not 0.0 <= lo <= hi <= 1.0:
            raise ValueError(f"feeder.pass_band {self.pass_band}: expected 0 <= low <= high <= 1")
        if self.frontier and self.calibration is None:
            raise ValueError("feeder.frontier needs feeder.calibration (the pass rates it "
                             "starts from)")  # fmt: skip
        if self.skip_greedy_solved and self.calibration is None:
            raise ValueError("feeder.skip_greedy_solved needs feeder.calibration (the greedy "
                             "outcomes it records)")  # fmt: skip
        return self
