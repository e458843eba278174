"""The demo's terminal side: the live progress table, the drain after the budget, the
accounting check and the closing summary. It works on a `DemoRun` (services/demo.py's
Demo is one)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from rich.live import Live
from rich.table import Table

from services.rollout.stats import Row, RunStats

if TYPE_CHECKING:
    from rich.console import Console

    from services.config import DemoSettings
    from services.rollout.monitor import Monitor
    from services.rollout.report import Report
    from services.rollout.supervise import Supervisor
    from services.settings import Settings


class DemoRun(Protocol):
    """What the terminal side reads of a running demo."""

    s: Settings
    cfg: DemoSettings
    console: Console
    stats: RunStats
    monitor: Monitor | None
    procs: Supervisor | None

    def say(self, text: str) -> None: ...

    def snapshot(self) -> Row: ...


REFRESH_S = 0.5
SNAPSHOT_S = 2.0


def _fmt(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def table(row: Row, budget_s: float, services: list[Any]) -> Table:
    t = Table(title="rollstream: streaming RL on the local stack", show_header=False, box=None)
    t.add_column(style="bold")
    t.add_column()
    t.add_row("elapsed", f"{row.t:6.0f} s of {budget_s:.0f} s")
    t.add_row("policy version", f"v{row.version}  (samples consumed {row.samples_consumed})")
    t.add_row("reward (last 20 s)", _fmt(row.reward))
    for suite, value in row.suite_reward.items():
        t.add_row(f"  {suite}", _fmt(value))
    t.add_row("throughput", f"{row.traj_per_s:.1f} sampled/s, {row.scored_per_s:.1f} scored/s")
    t.add_row("trajectories", f"{row.trajectories} published, {row.scored} scored")
    t.add_row("ledger", f"{row.trained} trained, {row.dropped} dropped, {row.masked} masked")
    t.add_row("outstanding", f"{row.outstanding} (published - consumed by the learner)")
    t.add_row("staleness", f"{_fmt(row.staleness, 2)} versions behind when scored")
    t.add_row(
        "all-equal groups",
        f"{_fmt(row.flat_groups, 2)} of {row.groups} (no signal: "
        f"all failed {_fmt(row.all_failed, 2)}, all passed {_fmt(row.all_passed, 2)})",
    )
    t.add_row("dead letters", str(row.dead_letters))
    alive = ", ".join(f"{s.name}{'' if s.alive else ' (down)'}" for s in services)
    t.add_row("services", alive)
    return t


async def watch(demo: DemoRun, budget_s: float) -> int:
    """Show progress until the budget is spent (0) or a service crashed (1)."""
    assert demo.procs is not None
    end = time.monotonic() + budget_s
    last_snap = last_line = 0.0
    row = demo.snapshot()
    with Live(console=demo.console, auto_refresh=False, transient=False) as live:
        while time.monotonic() < end:
            crashed = demo.procs.crashed()
            if crashed:
                live.stop()
                for s in crashed:
                    demo.say(f"[red]{s.name} exited ({s.proc.returncode if s.proc else '?'})[/]")
                    demo.say(s.tail())
                return 1
            now = time.monotonic()
            if now - last_snap >= SNAPSHOT_S:
                row, last_snap = demo.snapshot(), now
            if demo.cfg.live and demo.console.is_terminal:
                live.update(table(row, budget_s, demo.procs.services), refresh=True)
            elif now - last_line >= 15:
                last_line = now
                demo.say(_line(row))
            await asyncio.sleep(REFRESH_S)
    return 0


def _line(row: Row) -> str:
    """The live status line. `consumed` is the learner's own announced count (trained,
    dropped, masked); the ledger's `trained` lags until the learner flushes its outbox at a
    checkpoint, so the line read `trained 0` for a whole demo."""
    return (
        f"t={row.t:.0f}s v{row.version} reward {_fmt(row.reward)} "
        f"{row.traj_per_s:.0f} traj/s published {row.trajectories} scored {row.scored} "
        f"consumed {row.samples_consumed} outstanding {row.outstanding} "
        f"staleness {_fmt(row.staleness, 2)} "
        f"all-equal groups {_fmt(row.flat_groups, 2)} of {row.groups} "
        f"(failed {_fmt(row.all_failed, 2)}, passed {_fmt(row.all_passed, 2)})"
    )


async def drain(demo: DemoRun) -> None:
    """Wait (at most demo.drain_s) until every published trajectory is scored or dropped,
    and the learner has consumed every reward (or has been idle past its batch wait)."""
    assert demo.monitor is not None
    stats, mon = demo.stats, demo.monitor
    deadline = time.monotonic() + demo.cfg.drain_s
    idle_limit = demo.s.learner.batch_max_wait_s + 5
    last_consumed, since = -1, time.monotonic()
    while time.monotonic() < deadline:
        dropped_early = sum(1 for t in mon.published if t not in mon.scored and t in stats.ledger)
        all_scored = len(mon.scored) + dropped_early >= len(mon.published)
        if stats.samples_consumed != last_consumed:
            last_consumed, since = stats.samples_consumed, time.monotonic()
        consumed = stats.samples_consumed >= len(mon.scored)
        if all_scored and (consumed or time.monotonic() - since > idle_limit):
            return
        await asyncio.sleep(0.5)
    demo.say(f"[yellow]drain: {demo.cfg.drain_s:.0f} s passed with work in flight[/]")


async def settle_ledger(demo: DemoRun, timeout_s: float = 20.0) -> None:
    """After the learner stopped: wait for its last ledger entries to be read."""
    assert demo.monitor is not None
    for _ in range(int(timeout_s / 0.5)):
        if not demo.monitor.unaccounted():
            return
        await asyncio.sleep(0.5)


def accounting(demo: DemoRun) -> dict[str, Any]:
    """Every published trajectory: scored and trained, or dropped/masked with a reason."""
    mon = demo.monitor
    if mon is None:
        return {}
    missing = mon.unaccounted()
    return {
        "published trajectories": len(mon.published),
        "with a ledger entry": len(mon.published) - missing,
        "without (in flight at the stop)": missing,
        "dropped/masked by reason": dict(sorted(demo.stats.drop_reasons.items())) or "none",
        "policy versions that sampled": f"{min(mon.versions_sampled, default=-1)}.."
        f"{max(mon.versions_sampled, default=-1)}",
    }


def print_summary(demo: DemoRun, rep: Report, plot_path: Path | None, md: Path) -> None:
    demo.console.rule("[bold]result")
    t = Table(show_header=True, header_style="bold")
    cols = ("held-out suite", "tasks", "greedy before ± SE", "after ± SE", "change / SE",
            "fixed / broken (paired)")  # fmt: skip
    for col in cols:
        t.add_column(col)
    for line in rep.heldout_lines():
        t.add_row(*line)
    demo.console.print(t)
    for key, value in [*rep.run_figures().items(), *rep.accounting.items()]:
        demo.say(f"{key}: {value}")
    demo.say(f"pipeline ran {rep.minutes:.1f} min; final policy v{rep.final_version}")
    demo.say(f"report: {md}" + (f"  plot: {plot_path}" if plot_path else " (no matplotlib)"))
