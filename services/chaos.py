"""`rollstream chaos --minutes N`: the tiny pipeline under SIGKILLs, then an audit.

1. A stack of its own: a Kafka broker and a Redis (AOF) on free ports under
   `runs/<prefix>/state` (the shared stack is never touched; the Docker engine is shared,
   it is not a victim), the run's topics.
2. The services as processes (services/demo.py's environment): a sandbox worker, the
   reward dispatcher, two learners (one active, one standby on the lease), a generator
   and the feeder.
3. For N minutes, rounds over the components in a shuffled order (generator,
   dispatcher, sandbox worker, learner, Redis, the Kafka broker), one strike every
   STRIKE_EVERY_S: SIGKILL one, start it again a second later, and go on to the next
   strike without waiting; a task per strike measures its recovery concurrently: the
   seconds until the component's own output grows again (trajectories, rewards, sandbox
   results, ledger; Redis and the broker: rewards and ledger). Each round ends with a
   SIGSTOP of the sandbox worker past its session timeout, then SIGCONT (it is fenced
   and exits; it is started again). A service that exits on its own is started again.
   Choices that keep the numbers meaningful: a broker kill holds the schedule until the
   broker's recovery is measured (with the broker down nothing else can show progress,
   so a strike then would only measure the broker again); a component is struck again
   only after its last recovery was measured; a round does not start with the component
   the last one ended on. Overlapping recoveries of different components are allowed: a
   dispatcher's recovery can include a sandbox worker's restart that came 9 s later.
   At least MIN_ROUNDS rounds run (every component killed 3 times, broker included);
   after that a round starts only if it is expected to end within N minutes.
4. Drain: the feeder and the generator stop; the rest finish what was published; the
   learners stop (final checkpoint); `rollstream audit --finished` of the run.
5. `lost N, trained twice N, conflicts N` and the recovery times per component.

services/chaos_stack.py holds the stack, process and offset plumbing.
"""

from __future__ import annotations

import asyncio
import random
import signal
import statistics
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from schemas import topics

if TYPE_CHECKING:
    from services.chaos_stack import ChaosStack
    from services.settings import Settings

COMPONENTS = ("generator", "dispatcher", "sandbox-worker", "learner", "redis", "kafka")
PROGRESS = {
    "generator": (topics.TRAJECTORIES,),
    "dispatcher": (topics.REWARDS,),
    "sandbox-worker": (topics.SANDBOX_RESULTS,),
    "learner": (topics.LEDGER,),
    "redis": (topics.REWARDS, topics.LEDGER),
    "kafka": (topics.REWARDS, topics.LEDGER),
    "sandbox-worker (paused)": (topics.SANDBOX_RESULTS,),
}
"""The topics whose growth shows that a component works again (all of them)."""
RECOVERY_TIMEOUT_S = 150.0
PAUSE_S = 16.0
"""SIGSTOP length: past the sandbox worker's 10 s session timeout."""
STRIKE_EVERY_S = 9.0
"""The schedule: one strike every 9 s, whether the last one has recovered or not."""
MIN_ROUNDS = 3


@dataclass
class ChaosReport:
    minutes: float
    strikes: list[str] = field(default_factory=list)
    recoveries: dict[str, list[float]] = field(default_factory=dict)
    not_recovered: dict[str, int] = field(default_factory=dict)
    restarts_on_own: dict[str, int] = field(default_factory=dict)
    lost: int = 0
    trained_twice: int = 0
    conflicts: int = 0
    audit: dict[str, Any] = field(default_factory=dict)

    @property
    def clean(self) -> bool:
        return not (self.lost or self.trained_twice or self.conflicts)

    def line(self) -> str:
        return f"lost {self.lost}, trained twice {self.trained_twice}, conflicts {self.conflicts}"

    def recovery_lines(self) -> list[str]:
        out = []
        for name, times in sorted(self.recoveries.items()):
            missed = self.not_recovered.get(name, 0)
            if times:
                out.append(
                    f"{name}: {len(times) + missed} kills, recovery median "
                    f"{statistics.median(times):.1f} s, max {max(times):.1f} s"
                    + (f", {missed} not recovered in {RECOVERY_TIMEOUT_S:.0f} s" if missed else "")
                )
            else:
                out.append(f"{name}: {missed} kills, none recovered in {RECOVERY_TIMEOUT_S:.0f} s")
        for name, n in sorted(self.restarts_on_own.items()):
            out.append(f"{name}: exited on its own {n} times (started again)")
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "minutes": self.minutes,
            "lost": self.lost,
            "trained_twice": self.trained_twice,
            "conflicts": self.conflicts,
            "strikes": self.strikes,
            "recoveries_s": self.recoveries,
            "not_recovered": self.not_recovered,
            "restarts_on_own": self.restarts_on_own,
            "audit": self.audit,
        }


def trained_twice(conflicts: dict[str, list[str]]) -> int:
    """Trajectories with two or more distinct `trained` ledger entries."""
    return sum(1 for fates in conflicts.values() if sum(f.startswith("trained") for f in fates) > 1)


async def _recover(
    stack: ChaosStack, since: float, base: dict[topics.TopicSpec, dict[int, int]]
) -> float | None:
    """Seconds from `since` until a committed record reached every progress topic past
    `base` (its per-partition end offsets before the strike)."""
    if not base:  # the broker did not answer before the strike: nothing to compare with
        return None
    deadline = time.monotonic() + RECOVERY_TIMEOUT_S
    waiting = dict(base)
    while waiting and time.monotonic() < deadline:
        for spec, at in list(waiting.items()):
            left = deadline - time.monotonic()
            if left > 0 and await stack.arrived(spec, at, min(5.0, left)):
                del waiting[spec]
    return None if waiting else time.monotonic() - since


async def _measure(
    stack: ChaosStack,
    report: ChaosReport,
    label: str,
    since: float,
    base: dict[topics.TopicSpec, dict[int, int]],
) -> None:
    """One strike's recovery, measured while the next strikes go on."""
    try:
        took = await _recover(stack, since, base)
    except Exception as exc:  # a probe that failed is a measurement lost, not the run
        stack.say(f"[yellow]{label}: recovery not measured: {exc!r}[/]")
        took = None
    if took is None:
        report.not_recovered[label] = report.not_recovered.get(label, 0) + 1
        report.recoveries.setdefault(label, [])
        stack.say(f"[yellow]{label}: no progress within {RECOVERY_TIMEOUT_S:.0f} s[/]")
    else:
        report.recoveries.setdefault(label, []).append(round(took, 2))
        stack.say(f"{label}: recovered in {took:.1f} s")


async def _strike(
    stack: ChaosStack, report: ChaosReport, name: str, paused: bool
) -> asyncio.Task[None]:
    """Kill (or pause) `name` and start it again; returns the task measuring its recovery."""
    label = f"{name} (paused)" if paused else name
    if paused:
        stack.signal(name, signal.SIGSTOP)
        since = time.monotonic()
        await asyncio.sleep(PAUSE_S)
        base = await stack.ends([topics.SANDBOX_RESULTS])
        stack.signal(name, signal.SIGCONT)
    else:
        base = await stack.ends(list(PROGRESS[label]))
        since = time.monotonic()
        await stack.kill(name)
        await asyncio.sleep(1.0)
        await stack.restart(name)
    report.strikes.append(label)
    done = "paused and resumed" if paused else "killed and started again"
    stack.say(f"{label}: {done} (strike {len(report.strikes)})")
    return asyncio.create_task(_measure(stack, report, label, since, base))


def _order(rng: random.Random, last: str | None) -> list[str]:
    """A shuffled round that does not start with the component the last round ended on."""
    order = list(COMPONENTS)
    rng.shuffle(order)
    if order[0] == last:
        order.append(order.pop(0))
    return order


async def _round(
    stack: ChaosStack, report: ChaosReport, order: list[str], pending: dict[str, asyncio.Task[None]]
) -> None:
    """One strike per component every STRIKE_EVERY_S, then the pause of the sandbox
    worker. A component is struck again only once its last recovery is measured; a
    broker kill holds the schedule until the broker's recovery is measured."""
    for name in [*order, "sandbox-worker (paused)"]:
        component = name.removesuffix(" (paused)")
        start = time.monotonic()
        if (prev := pending.get(component)) is not None:
            await prev
        task = await _strike(stack, report, component, paused=name != component)
        pending[component] = task
        if component == "kafka":
            await task
        await asyncio.sleep(max(0.0, STRIKE_EVERY_S - (time.monotonic() - start)))


async def _rounds(stack: ChaosStack, report: ChaosReport, seconds: float) -> None:
    """Rounds over the components in a shuffled order. A round starts while it is
    expected to end within `seconds` (by the last round's length), and always until
    MIN_ROUNDS rounds were struck: every component is killed at least MIN_ROUNDS times."""
    rng = random.Random()
    end = time.monotonic() + seconds
    pending: dict[str, asyncio.Task[None]] = {}
    rounds, took, last = 0, 0.0, None
    while rounds < MIN_ROUNDS or time.monotonic() + took <= end:
        begun = time.monotonic()
        order = _order(rng, last)
        await _round(stack, report, order, pending)
        rounds, took, last = rounds + 1, time.monotonic() - begun, order[-1]
        stack.say(f"round {rounds} struck in {took:.0f} s")
    stack.say("chaos over: waiting for the last recoveries to be measured")
    await asyncio.gather(*pending.values())


async def _audit(stack: ChaosStack, report: ChaosReport) -> None:
    from services import audit

    rep = await audit.audit(stack.settings, finished=True)
    report.audit = rep.to_json()
    report.lost = rep.unaccounted
    report.conflicts = len(rep.conflicts)
    report.trained_twice = trained_twice(rep.conflicts)


async def run_chaos(settings: Settings, minutes: float) -> ChaosReport:
    """The whole chaos run (see the module); the own stack is stopped at the end."""
    from services.chaos_stack import ChaosStack

    report = ChaosReport(minutes=minutes)
    stack = ChaosStack.create(settings)
    try:
        await stack.up()
        stack.start_all()
        await stack.wait_flowing()
        keeper = asyncio.create_task(stack.keep_alive(report.restarts_on_own))
        try:
            await _rounds(stack, report, minutes * 60)
            await stack.drain()
        finally:
            keeper.cancel()
        await stack.stop_learners()
        await _audit(stack, report)
    finally:
        await asyncio.to_thread(stack.down)
    stack.write(report.to_json())
    return report
