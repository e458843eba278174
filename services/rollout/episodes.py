"""Which episode runs a task: the registry of environments (DESIGN.md section 7).

The generator asks `Episodes.for_task(task)`: the first kind whose `accepts(task)` is true,
the environments registered with `register` first (newest first), then the built-in ones:
tool calling (the task's metadata names tools), multi-turn with the sandbox (max_turns > 1
and a sandboxed verifier), single turn (every other task). Each kind is built once per
generator, with the generator's `episode.Context`.
"""

from __future__ import annotations

from typing import TypeVar

from schemas.rollout import Task, Trajectory
from services.rollout import episode
from services.rollout.multiturn import MultiTurn
from services.rollout.stops import stop_strings
from services.rollout.toolcall import ToolCalling


class SingleTurn:
    """One completion per member: the group is sampled in one call."""

    def __init__(self, ctx: episode.Context) -> None:
        self.ctx = ctx

    @classmethod
    def accepts(cls, task: Task) -> bool:
        return True

    async def close(self) -> None:
        return None

    async def group(self, task: Task, group_id: str) -> list[Trajectory]:
        prompt_ids = self.ctx.codec.prompt_ids(task)
        stop = stop_strings(task)
        turns = await self.ctx.sampler.turns(prompt_ids, task.group_size, stop)
        return [
            self.ctx.trajectory(task, group_id, i, prompt_ids, [turn])
            for i, turn in enumerate(turns)
        ]


BUILT_IN: tuple[type[episode.Episode], ...] = (ToolCalling, MultiTurn, SingleTurn)
_registered: list[type[episode.Episode]] = []


E = TypeVar("E", bound=type[episode.Episode])


def register(kind: E) -> E:
    """Class decorator: try this environment before the ones registered earlier and the
    built-in ones."""
    if kind not in _registered:
        _registered.insert(0, kind)
    return kind


def import_environments(modules: list[str]) -> None:
    """Import the modules of generator.environments (each registers its environments)."""
    import importlib

    for name in modules:
        importlib.import_module(name)


def kinds() -> list[type[episode.Episode]]:
    """Every environment, in the order they are tried."""
    return [*_registered, *BUILT_IN]


class Episodes:
    """The environments of one generator, each built on first use."""

    def __init__(self, ctx: episode.Context) -> None:
        self.ctx = ctx
        self.running: dict[type[episode.Episode], episode.Episode] = {}

    def for_task(self, task: Task) -> episode.Episode:
        kind = next(k for k in kinds() if k.accepts(task))
        if kind not in self.running:
            self.running[kind] = kind(self.ctx)
        return self.running[kind]

    async def close(self) -> None:
        for running in self.running.values():
            await running.close()
        self.running.clear()
