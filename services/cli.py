"""The `rollstream` command line. Thin: every command imports its heavy modules lazily,
so `rollstream --help` never pays for torch, aiokafka, docker or pydantic."""

from __future__ import annotations

import json
import sys
from typing import Annotated, Any

import typer

from services.cli_common import root_options, settings_from

__all__ = ["app", "main", "settings_from"]

app = typer.Typer(
    name="rollstream",
    help="Event-driven streaming rollouts for RL post-training of language-model agents.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
config_app = typer.Typer(help="Inspect the merged configuration.", no_args_is_help=True)
topics_app = typer.Typer(help="Create and inspect the run's Kafka topics.", no_args_is_help=True)
app.add_typer(config_app, name="config")
app.add_typer(topics_app, name="topics")


app.callback()(root_options)


def _print_checks(checks: list[Any], as_json: bool) -> None:
    if as_json:
        typer.echo(json.dumps([c.to_json() for c in checks], indent=2, default=str))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(show_header=True, header_style="bold", box=None, pad_edge=False)
    for col in ("component", "status", "version", "endpoint", "detail"):
        table.add_column(col, overflow="fold")
    for c in checks:
        status = "[green]healthy[/]" if c.healthy else "[red]DOWN[/]"
        detail = c.detail + (f"\n[yellow]fix:[/] {c.fix}" if c.fix and not c.healthy else "")
        table.add_row(c.component, status, c.version, c.endpoint, detail)
    Console().print(table)


Brokers = Annotated[
    int | None,
    typer.Option(help="Nodes of the local Kafka cluster (kafka.brokers; default 1)."),
]


@app.command()
def up(
    ctx: typer.Context,
    only: Annotated[
        str | None,
        typer.Option(help="Comma-separated subset: kafka,redis,docker,image,topics,model."),
    ] = None,
    brokers: Brokers = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")] = False,
) -> None:
    """Bring up the local stack (idempotent): Kafka, Redis, Docker, sandbox image, topics, and
    the configured model (`learner.model`: fetched and converted once).

    `--brokers 3`: a local 3-node KRaft cluster (topics get replication 3, min ISR 2);
    a node that died is started again."""
    from rich.console import Console

    from services.infra import stack

    settings = settings_from(ctx, **{"kafka.brokers": brokers})
    console = Console(stderr=True)
    status = console.status("starting")

    def on_step(name: str | None) -> None:
        if name is None:
            status.stop()
        else:
            status.update(f"[bold]{name}[/]: bringing up")
            status.start()

    checks = stack.up(settings, only.split(",") if only else None, on_step=on_step)
    _print_checks(checks, as_json)
    raise typer.Exit(0 if all(c.healthy for c in checks) else 1)


@app.command()
def down(ctx: typer.Context) -> None:
    """Stop what `rollstream up` started (every Kafka node, Redis, dockerd; and remove leftover
    sandbox containers)."""
    from services.infra import stack

    for name, was_running in stack.down(settings_from(ctx)):
        typer.echo(f"{name}: {'stopped' if was_running else 'not running (nothing to stop)'}")


@app.command()
def doctor(
    ctx: typer.Context,
    brokers: Brokers = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")] = False,
) -> None:
    """One line per component: status, version, endpoint. Exit 0 only when all are healthy.
    A multi-node local cluster gets one more line per node."""
    from services.infra import stack

    checks = stack.doctor(settings_from(ctx, **{"kafka.brokers": brokers}))
    _print_checks(checks, as_json)
    raise typer.Exit(0 if all(c.healthy for c in checks) else 1)


@config_app.command("show")
def config_show(
    ctx: typer.Context,
    as_json: Annotated[bool, typer.Option("--json", help="Print as JSON.")] = False,
) -> None:
    """Print the merged settings (defaults < TOML < env ROLLSTREAM__SECTION__KEY < CLI)."""
    from services.settings import render_toml

    settings = settings_from(ctx)
    if as_json:
        typer.echo(settings.model_dump_json(indent=2))
    else:
        typer.echo(render_toml(settings))


@topics_app.command("ensure")
def topics_ensure(
    ctx: typer.Context,
    prefix: Annotated[str | None, typer.Option(help="Topic prefix (topics.prefix).")] = None,
) -> None:
    """Create the run's declared topics that are missing (idempotent)."""
    import asyncio

    from services import topics

    settings = settings_from(ctx, **{"topics.prefix": prefix})
    states = asyncio.run(topics.ensure(settings))
    problems = [p for s in states for p in s.problems()]
    for s in states:
        typer.echo(f"{s.name}: {s.partitions} partitions {s.configs}")
    for p in problems:
        typer.echo(f"problem: {p}", err=True)
    raise typer.Exit(1 if problems else 0)


@topics_app.command("list")
def topics_list(
    ctx: typer.Context,
    prefix: Annotated[str | None, typer.Option(help="Topic prefix (topics.prefix).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print as JSON.")] = False,
) -> None:
    """List the run's declared topics with key, partitions, retention and whether they exist."""
    import asyncio

    from services import topics

    settings = settings_from(ctx, **{"topics.prefix": prefix})
    states = asyncio.run(topics.describe(settings))
    rows = [
        {
            "topic": s.name,
            "key": s.spec.key,
            "partitions": s.partitions,
            "declared_partitions": s.want_partitions,
            "compacted": s.spec.compacted,
            "retention_ms": s.spec.retention_ms,
            "exists": s.exists,
        }
        for s in states
    ]
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    for r in rows:
        typer.echo(
            f"{r['topic']:<40} key={r['key']:<14} partitions={r['partitions']}/"
            f"{r['declared_partitions']} compacted={r['compacted']} exists={r['exists']}"
        )


@app.command()
def demo(
    ctx: typer.Context,
    policy: Annotated[
        str | None,
        typer.Option(help="smollm2 (default: on the code suite) or tiny (demo.policy)."),
    ] = None,
    two_turn: Annotated[
        bool | None,
        typer.Option("--two-turn/--single-turn", help="Two-turn self-correction (demo.two_turn)."),
    ] = None,
    minutes: Annotated[
        float | None, typer.Option(help="Pipeline budget in minutes (demo.budget_minutes).")
    ] = None,
) -> None:
    """The main job: bring the stack up and train a policy on the local machine."""
    from services.demo import run_demo

    flags = {"demo.policy": policy, "demo.budget_minutes": minutes}
    flags["demo.two_turn"] = None if two_turn is None else str(two_turn).lower()
    raise typer.Exit(run_demo(settings_from(ctx, **flags)))


def _register_areas() -> None:
    from services import (
        cli_chaos,
        cli_dispatcher,
        cli_eval,
        cli_learner,
        cli_ops,
        cli_rollout,
        cli_sandbox,
        cli_schemas,
    )

    cli_schemas.register(app)
    cli_sandbox.register(app)
    cli_dispatcher.register(app)
    cli_learner.register(app)
    cli_eval.register(app)
    cli_eval.register_calibrate(app)
    cli_ops.register(app)
    cli_rollout.register(app)
    cli_chaos.register(app)


_register_areas()


def main() -> None:
    try:
        app()
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main()
