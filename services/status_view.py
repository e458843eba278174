"""Rendering of `rollstream status` (rich), once or refreshed live."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Group

    from services.settings import Settings
    from services.status import Snapshot

SPARK = "▁▂▃▄▅▆▇█"


def sparkline(values: list[float]) -> str:
    """A one-line chart of the values (empty for none)."""
    if not values:
        return ""
    lo, hi = min(values), max(values)
    span = hi - lo or 1.0
    return "".join(SPARK[round((v - lo) / span * (len(SPARK) - 1))] for v in values)


def render(snap: Snapshot) -> Group:
    from rich.console import Group
    from rich.table import Table

    head = Table.grid(padding=(0, 2))
    head.add_column(style="bold")
    head.add_column()
    learner = snap.learner
    head.add_row("run", snap.prefix)
    if learner:
        head.add_row(
            "learner",
            f"{learner['policy']} v{learner['version']} step {learner['step']}, "
            f"{learner['samples_consumed']} samples, published {learner['published_s_ago']} s ago",
        )
    else:
        head.add_row("learner", "[yellow]no weights published yet[/]")
    if snap.staleness:
        s = snap.staleness
        head.add_row("staleness", f"mean {s['mean']} max {s['max']:.0f} versions (n={s['n']:.0f})")
    if snap.reward_trend:
        trend = " ".join(f"{v:.3f}" for v in snap.reward_trend)
        head.add_row("reward", f"{sparkline(snap.reward_trend)}  {trend}")
    if snap.outcomes:
        head.add_row("outcomes", ", ".join(f"{k} {v}" for k, v in sorted(snap.outcomes.items())))
    head.add_row("sandbox", _sandbox(snap.sandbox))
    if snap.ingest:
        pending = ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in snap.ingest.items())
        head.add_row("ingest", pending)
    dlq = f"[red]{snap.dlq}[/]" if snap.dlq else "0"
    head.add_row("dlq", dlq)
    for problem in snap.problems:
        head.add_row("[yellow]problem[/]", problem)
    return Group(head, _groups(snap), _topics(snap))


def _sandbox(sandbox: dict[str, Any]) -> str:
    containers = sandbox.get("containers")
    if isinstance(containers, dict):
        boxes = ", ".join(f"{n} {state}" for state, n in sorted(containers.items())) or "none"
    else:
        boxes = str(containers)
    workers, backlog = sandbox.get("workers", 0), sandbox.get("backlog", 0)
    return f"{workers} workers, backlog {backlog}, containers: {boxes}"


def _groups(snap: Snapshot) -> Any:
    from rich.table import Table

    table = Table(title="consumer groups", title_justify="left", box=None, header_style="bold")
    for col in ("group", "members", "state", "lag"):
        table.add_column(col)
    for g in snap.groups:
        short = {t.removeprefix(snap.prefix + "."): n for t, n in g.lag.items()}
        lag = ", ".join(f"{t} {n}" for t, n in sorted(short.items()))
        members = "?" if g.members is None else str(g.members)
        table.add_row(g.group, members, g.state, lag or "-")
    if not snap.groups:
        table.add_row("(none)", "", "", "")
    return table


def _topics(snap: Snapshot) -> Any:
    from rich.table import Table

    table = Table(title="topics", title_justify="left", box=None, header_style="bold")
    table.add_column("topic")
    table.add_column("records", justify="right")
    table.add_column(f"per s ({snap.window_s:.0f} s)", justify="right")
    for name in sorted(snap.topic_records):
        rate = snap.throughput.get(name, 0.0)
        table.add_row(name, str(snap.topic_records[name]), f"{rate:.2f}")
    return table


def live(settings: Settings, interval_s: float, count: int | None, window_s: float) -> None:
    """Refresh the view every `interval_s` until Ctrl-C (or `count` refreshes)."""
    from rich.live import Live

    from services.status import snapshot

    async def run() -> None:
        snap = await snapshot(settings, window_s)
        with Live(render(snap), refresh_per_second=4, screen=False) as view:
            done = 1
            while count is None or done < count:
                await asyncio.sleep(interval_s)
                view.update(render(await snapshot(settings, window_s)))
                done += 1

    asyncio.run(run())
