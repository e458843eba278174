"""CLI of the rollout area: `rollstream generator` and `rollstream feeder`. Registered on
the root app by services/cli.py; also runnable alone (`python -m services.cli_rollout`).
Heavy imports (torch, aiokafka) stay inside the commands, so `rollstream --help` stays
instant."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Annotated, Any

import typer

Prefix = Annotated[str | None, typer.Option(help="Topic prefix (topics.prefix).")]
LogLevel = Annotated[str, typer.Option(help="Python log level.")]


def _logging(level: str) -> None:
    logging.basicConfig(
        level=level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    logging.getLogger("aiokafka").setLevel(logging.WARNING)


def _echo_summary(summary: Any) -> None:
    import dataclasses

    typer.echo(json.dumps(dataclasses.asdict(summary), default=str))


def generator(
    ctx: typer.Context,
    prefix: Prefix = None,
    generator_id: Annotated[
        str | None, typer.Option(help="Name in trajectories and logs (generator.generator_id).")
    ] = None,
    seed: Annotated[int | None, typer.Option(help="Sampling seed (generator.seed).")] = None,
    metrics_port: Annotated[
        int | None, typer.Option(help="Prometheus port on 127.0.0.1 (0: off).")
    ] = None,
    max_groups: Annotated[int | None, typer.Option(help="Stop after this many groups.")] = None,
    idle_exit: Annotated[
        float | None, typer.Option(help="Stop after this many seconds without a task.")
    ] = None,
    log_level: LogLevel = "info",
) -> None:
    """Run a rollout generator: tasks -> sampled groups -> trajectories (weights hot-swapped)."""
    import asyncio

    from services.cli_common import settings_from
    from services.rollout.generator import run_service

    _logging(log_level)
    settings = settings_from(
        ctx,
        **{
            "topics.prefix": prefix,
            "generator.generator_id": generator_id,
            "generator.seed": seed,
            "generator.metrics_port": metrics_port,
        },
    )
    summary = asyncio.run(run_service(settings, max_groups=max_groups, idle_exit_s=idle_exit))
    _echo_summary(summary)


def feeder(
    ctx: typer.Context,
    prefix: Prefix = None,
    task_file: Annotated[
        list[Path] | None,
        typer.Option(help="JSONL task file (repeatable; adds to feeder.task_files).", exists=True),
    ] = None,
    suite: Annotated[
        list[str] | None,
        typer.Option(help="NAME=WEIGHT (repeatable): replaces feeder.suites."),
    ] = None,
    max_tasks: Annotated[int | None, typer.Option(help="Stop after this many tasks.")] = None,
    rate: Annotated[float | None, typer.Option(help="Tasks per second at most.")] = None,
    log_level: LogLevel = "info",
) -> None:
    """Run the task feeder: admitted tasks from built-in suites and JSONL files -> tasks."""
    import asyncio

    from services.cli_common import settings_from
    from services.rollout.feeder import run_service

    _logging(log_level)
    settings = settings_from(
        ctx, **{"topics.prefix": prefix, "feeder.max_tasks": max_tasks, "feeder.rate": rate}
    )
    updates: dict[str, Any] = {}
    if suite:
        updates["suites"] = _weights(suite)
    if task_file:
        updates["task_files"] = [*settings.feeder.task_files, *task_file]
    if updates:
        settings.feeder = settings.feeder.model_copy(update=updates)
    _echo_summary(asyncio.run(run_service(settings)))


def _weights(pairs: list[str]) -> dict[str, float]:
    out = {}
    for pair in pairs:
        name, sep, weight = pair.partition("=")
        try:
            out[name.strip()] = float(weight) if sep else 1.0
        except ValueError:
            msg = f"{pair!r}: expected NAME=WEIGHT"
            raise typer.BadParameter(msg, param_hint="--suite") from None
    return out


def register(app: typer.Typer) -> None:
    """Add `generator` and `feeder` to the root app."""
    app.command("generator")(generator)
    app.command("feeder")(feeder)


def main() -> None:
    """`python -m services.cli_rollout ...`: these commands under the root app's options."""
    from services.cli_common import root_options

    app = typer.Typer(name="rollstream", no_args_is_help=True, add_completion=False)
    app.callback()(root_options)
    register(app)
    app()


if __name__ == "__main__":
    main()
