"""Two-turn evaluation: does a second turn with public-test feedback fix first turns?

The same episode the generators run with `feeder.max_turns = 2` (services/rollout/
multiturn.py), decoded greedily and in batches: per task a first turn; its code is run
against the task's public `feedback_tests` only (`feedback_spec`); a first turn that fails
them gets the same observation the pipeline appends (`episode.observation_text`) and a
second turn decoded from prompt + first turn + observation. The final turn (the second
when there was one, else the first) is judged by the hidden scoring tests, as the reward
dispatcher judges a trajectory's last turn. The first turn is judged by the hidden tests
too, so both pass rates are over the same tasks: `ratio` = final / first.

A task without public tests gets no second turn (as in the pipeline). No observation ever
holds a hidden test or its expected value: only public-test verdicts are shown.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sandbox_workers.verifiers import feedback_spec
from schemas.envelope import new_id
from schemas.rollout import Task
from schemas.sandbox import Outcome, SandboxRequest, SandboxResult, VerifierSpec
from services.rollout.batched import Decoding, complete_ids
from services.rollout.episode import observation_text
from services.rollout.stops import stop_strings
from streams.groups import extract_code

if TYPE_CHECKING:
    from services.settings import Settings

Run = Callable[[Task, VerifierSpec, str], Awaitable[SandboxResult]]
"""(task, verifier spec, completion text) -> the sandbox's verdict on its code."""


@dataclass
class TurnsResult:
    suite: str
    tasks: int
    first_pass: float
    """Share of tasks whose greedy first turn passed the hidden tests."""
    final_pass: float
    """Share of tasks whose final turn passed the hidden tests."""
    second_turns: int
    """Tasks whose first turn failed the public tests and so got a second turn."""
    fixed: int
    """Tasks that failed the hidden tests on the first turn and passed on the second."""
    broken: int
    """Tasks that passed the hidden tests on the first turn and failed on the second."""

    @property
    def ratio(self) -> float:
        """final_pass / first_pass (NaN when no first turn passed)."""
        return self.final_pass / self.first_pass if self.first_pass else math.nan


def tally(suite: str, first: list[bool], final: list[bool], second: list[int]) -> TurnsResult:
    """The figures of per-task hidden verdicts `first` and `final`; `second`: the indices
    of the tasks that got a second turn."""
    n = len(first)
    again = set(second)
    return TurnsResult(
        suite=suite,
        tasks=n,
        first_pass=sum(first) / n if n else math.nan,
        final_pass=sum(final) / n if n else math.nan,
        second_turns=len(again),
        fixed=sum(1 for i in again if final[i] and not first[i]),
        broken=sum(1 for i in again if first[i] and not final[i]),
    )


def needs_second_turn(public: SandboxResult | None) -> bool:
    """A first turn gets a second when public tests ran and it did not pass them."""
    return public is not None and public.outcome != Outcome.PASSED


async def evaluate_two_turns(
    policy: Any, text: Any, tasks: list[Task], run: Run, settings: Settings, batch: int = 16
) -> TurnsResult:
    """Greedy two-turn episodes of every task, judged (see the module docstring)."""
    g = settings.generator
    ls = settings.learner
    how = Decoding(g.max_new_tokens, seed=ls.seed + 1, batch=batch, threads=ls.torch_threads)
    prompts = [text.prompt_ids(t) for t in tasks]
    stops = [stop_strings(t) for t in tasks]
    first = [
        r[0] for r in await asyncio.to_thread(complete_ids, policy, text, prompts, stops, 1, how)
    ]
    first_text = [text.text(d.tokens) for d in first]
    hidden = await asyncio.gather(
        *(run(t, t.verifier, c) for t, c in zip(tasks, first_text, strict=True))
    )
    public = await asyncio.gather(
        *(_public(run, t, c) for t, c in zip(tasks, first_text, strict=True))
    )
    again = [i for i, p in enumerate(public) if needs_second_turn(p)]
    contexts = [
        prompts[i]
        + list(first[i].tokens)
        + text.ids(observation_text(public[i], g.observation_chars))
        for i in again
    ]
    drawn = await asyncio.to_thread(
        complete_ids, policy, text, contexts, [stops[i] for i in again], 1, how
    )
    final_text = list(first_text)
    for i, rows in zip(again, drawn, strict=True):
        final_text[i] = text.text(rows[0].tokens)
    final = list(hidden)
    redo = await asyncio.gather(*(run(tasks[i], tasks[i].verifier, final_text[i]) for i in again))
    for i, result in zip(again, redo, strict=True):
        final[i] = result
    passed = [r.outcome == Outcome.PASSED for r in hidden]
    finals = [r.outcome == Outcome.PASSED for r in final]
    return tally(tasks[0].suite if tasks else "", passed, finals, again)


async def _public(run: Run, task: Task, completion: str) -> SandboxResult | None:
    spec = feedback_spec(task.verifier)
    return None if spec is None else await run(task, spec, completion)


def sandbox_run(settings: Settings, sandbox: Any) -> Run:
    """Run through a started `VerifyingSandbox` (its pool bounds the concurrency)."""
    d = settings.dispatcher

    async def run(task: Task, spec: VerifierSpec, completion: str) -> SandboxResult:
        rid = f"eval-{new_id()}"
        result: SandboxResult = await sandbox.run(
            SandboxRequest(
                request_id=rid, trajectory_id=rid, group_id=rid, task_id=task.task_id,
                code=extract_code(completion), verifier=spec,
                timeout_s=d.sandbox_timeout_s, memory_mb=d.sandbox_memory_mb,
            )
        )  # fmt: skip
        return result

    return run
