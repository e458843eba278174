"""Multi-turn episodes with the sandbox (DESIGN.md section 7): each turn's code runs in the
sandbox tier and its verdict is appended as an observation before the next turn, up to the
task's `max_turns` (capped by generator.max_turns). Runs tasks with max_turns > 1 and a
sandboxed verifier.

The episodes of a group run concurrently; their sampling calls take the generator's lock
one at a time, and weights may be swapped between two turns, so one trajectory can carry
tokens of several policy versions (policy_versions says which). The last turn's code is
not run here: the reward dispatcher verifies the final completion like any other.

What a turn's code is run against between turns is the task's public `feedback_tests`
only (`feedback_spec`): an observation shows public-test failures, never a hidden scoring
test or its expected value. A task without public tests gets no feedback run: its episode
ends after the first turn (as a single-turn episode), scored by the dispatcher.
finish_reason: `stop` (a turn passed), `turn_limit` (the budget ran out), `length` (no
room left under max_seq_len), `turn_timeout` (no sandbox verdict in time).
"""

from __future__ import annotations

import asyncio

from sandbox_workers.verifiers import feedback_spec
from schemas.envelope import new_id
from schemas.rollout import Task, Trajectory
from schemas.sandbox import Outcome, SandboxRequest, SandboxResult, VerifierSpec
from services.rollout import episode
from services.rollout.sandbox_client import SandboxClient
from services.rollout.stops import stop_strings
from streams.groups import extract_code


class MultiTurn:
    def __init__(self, ctx: episode.Context) -> None:
        self.ctx = ctx
        self.cfg = ctx.settings.generator
        self.client: SandboxClient | None = None

    @classmethod
    def accepts(cls, task: Task) -> bool:
        return task.max_turns > 1 and task.verifier.needs_sandbox

    async def close(self) -> None:
        if self.client is not None:
            await self.client.stop()

    async def group(self, task: Task, group_id: str) -> list[Trajectory]:
        if self.client is None:
            ctx = self.ctx
            client = SandboxClient(ctx.settings, ctx.producer, ctx.claim, "gen")
            await client.start()
            self.client = client
        prompt_ids = self.ctx.codec.prompt_ids(task)
        episodes = [self.episode(task, group_id, i, prompt_ids) for i in range(task.group_size)]
        return list(await asyncio.gather(*episodes))

    async def episode(
        self, task: Task, group_id: str, index: int, prompt_ids: list[int]
    ) -> Trajectory:
        traj_id = new_id()

        public = feedback_spec(task.verifier)

        async def step(t: int, turn: episode.Turn) -> tuple[list[episode.Observation], str | None]:
            if public is None:
                return [], None
            result = await self._run(public, task, group_id, traj_id, t, turn.text)
            if result is not None and result.outcome == Outcome.PASSED:
                return [], "stop"
            text = episode.observation_text(result, self.cfg.observation_chars)
            obs = episode.Observation(self.ctx.codec.ids(text), text)
            return [obs], (None if result is not None else "turn_timeout")

        turns = min(task.max_turns, self.cfg.max_turns)
        stop = stop_strings(task)
        parts, reason = await episode.turn_loop(self.ctx, prompt_ids, turns, step, stop)
        return self.ctx.trajectory(task, group_id, index, prompt_ids, parts, reason, traj_id)

    async def _run(
        self, public: VerifierSpec, task: Task, group_id: str, traj_id: str, turn: int, text: str
    ) -> SandboxResult | None:
        """Run one turn's code against the public tests `public` (never `task.verifier`)."""
        assert self.client is not None
        d = self.ctx.settings.dispatcher
        request = SandboxRequest(
            request_id=f"{traj_id}:turn{turn}",
            trajectory_id=traj_id,
            group_id=group_id,
            task_id=task.task_id,
            code=extract_code(text),
            verifier=public,
            timeout_s=d.sandbox_timeout_s,
            memory_mb=d.sandbox_memory_mb,
            turn=turn,
            parent_id=traj_id,
        )
        return await self.client.run(request, self.cfg.turn_timeout_s)
