"""Multi-turn episodes (DESIGN.md section 7): each turn's code runs in the sandbox tier and
its verdict is appended as an observation before the next turn, up to the task's
`max_turns` (capped by generator.max_turns).

The episodes of a group run concurrently; their sampling calls take the generator's lock
one at a time, and weights may be swapped between two turns, so one trajectory can carry
tokens of several policy versions (policy_versions says which). The last turn's code is
not run here: the reward dispatcher verifies the final completion like any other.
finish_reason: `stop` (a turn passed), `turn_limit` (the budget ran out), `length` (no
room left under max_seq_len), `turn_timeout` (no sandbox verdict in time).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from schemas.envelope import new_id
from schemas.rollout import Task, Trajectory
from schemas.sandbox import Outcome, SandboxRequest
from services.rollout import episode
from services.rollout.sandbox_client import SandboxClient
from streams.groups import extract_code

if TYPE_CHECKING:
    from services.rollout.generator import Generator


class MultiTurn:
    def __init__(self, gen: Generator) -> None:
        self.gen = gen
        self.client: SandboxClient | None = None

    async def stop(self) -> None:
        if self.client is not None:
            await self.client.stop()

    async def group(self, task: Task, group_id: str) -> list[Trajectory]:
        if self.client is None:
            client = SandboxClient(self.gen.settings, self.gen.producer, self.gen.claim, "gen")
            await client.start()
            self.client = client
        prompt_ids = self.gen.codec.prompt_ids(task)
        episodes = [self.episode(task, group_id, i, prompt_ids) for i in range(task.group_size)]
        return list(await asyncio.gather(*episodes))

    async def episode(
        self, task: Task, group_id: str, index: int, prompt_ids: list[int]
    ) -> Trajectory:
        gen, traj_id = self.gen, new_id()
        turns = min(task.max_turns, gen.cfg.max_turns)
        parts: list[episode.Part] = []
        context = list(prompt_ids)
        reason = None
        for t in range(turns):
            turn = await self._sample(context)
            parts.append(turn)
            context += turn.tokens
            if t == turns - 1:
                reason = "turn_limit" if turns > 1 else None
                break
            result = await self._run(task, group_id, traj_id, t, turn.text)
            if result is not None and result.outcome == Outcome.PASSED:
                reason = "stop"
                break
            obs_text = episode.observation_text(result, gen.cfg.observation_chars)
            obs = episode.Observation(gen.codec.ids(obs_text), obs_text)
            if len(context) + len(obs.tokens) + 2 > gen.policy.max_seq_len:
                reason = "length"
                break
            parts.append(obs)
            context += obs.tokens
            if result is None:
                reason = "turn_timeout"
                break
        return episode.trajectory(
            task,
            group_id=group_id,
            index=index,
            prompt_ids=prompt_ids,
            prompt_text=gen.codec.text(prompt_ids),
            parts=parts,
            generator_id=gen.id,
            finish_reason=reason,
            trajectory_id=traj_id,
        )

    async def _sample(self, context: list[int]) -> episode.Turn:
        gen = self.gen
        async with gen.lock:
            await gen.swap()
            version = gen.version
            (completion,) = await asyncio.to_thread(gen.sample, context, 1)
        return gen.turn(completion, version)

    async def _run(self, task: Task, group_id: str, traj_id: str, turn: int, text: str) -> Any:
        assert self.client is not None
        d = self.gen.settings.dispatcher
        request = SandboxRequest(
            request_id=f"{traj_id}:turn{turn}",
            trajectory_id=traj_id,
            group_id=group_id,
            task_id=task.task_id,
            code=extract_code(text),
            verifier=task.verifier,
            timeout_s=d.sandbox_timeout_s,
            memory_mb=d.sandbox_memory_mb,
            turn=turn,
            parent_id=traj_id,
        )
        return await self.client.run(request, self.gen.cfg.turn_timeout_s)
