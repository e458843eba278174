"""CLI of `rollstream eval` (services/evalcmd.py). Registered on the root app by
services/cli.py; heavy imports stay inside the command."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer


def register(app: typer.Typer) -> None:
    """Add `rollstream eval`."""

    @app.command("eval")
    def eval_(
        ctx: typer.Context,
        policy: Annotated[
            str,
            typer.Option(
                help="initial (the model learner.model names), a published version "
                "(a number or latest, under --prefix) or a safetensors weights file."
            ),
        ] = "initial",
        suite: Annotated[str | None, typer.Option(help="A built-in suite.")] = None,
        tasks: Annotated[
            Path | None, typer.Option(help="A JSONL task file (the feeder.task_files format).")
        ] = None,
        split: Annotated[str, typer.Option(help="Split of --suite.")] = "heldout",
        samples: Annotated[
            int, typer.Option(min=0, help="Sampled completions per task, for pass@k (k <= K).")
        ] = 0,
        limit: Annotated[int | None, typer.Option(min=1, help="The first N tasks only.")] = None,
        batch: Annotated[int, typer.Option(min=1, help="Rows decoded together.")] = 16,
        prefix: Annotated[str | None, typer.Option(help="Topic prefix (topics.prefix).")] = None,
        turns: Annotated[
            int,
            typer.Option(
                min=1,
                max=2,
                help="2: greedy two-turn episodes with public-test feedback; "
                "prints first-turn and final pass rates and their ratio.",
            ),
        ] = 1,
        as_json: Annotated[bool, typer.Option("--json", help="Print the figures as JSON.")] = False,
    ) -> None:
        """Greedy pass@1 (binomial SE) and pass@k of a policy, judged in the sandbox tier."""
        import asyncio
        import logging

        from services import evalcmd
        from services.cli_common import settings_from

        logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s: %(message)s")
        logging.getLogger("rollstream.eval").setLevel(logging.INFO)
        settings = settings_from(ctx, **{"topics.prefix": prefix})
        req = evalcmd.EvalRequest(policy, suite, tasks, split, samples, limit, batch, turns)
        try:
            fig = asyncio.run(evalcmd.run(settings, req))
        except ValueError as exc:
            typer.echo(f"rollstream eval: {exc}", err=True)
            raise typer.Exit(2) from exc
        if as_json:
            typer.echo(json.dumps(fig, indent=2))
            return
        from rich.console import Console

        Console().print(evalcmd.table(fig))


def register_calibrate(app: typer.Typer) -> None:
    """Add `rollstream calibrate`."""

    @app.command("calibrate")
    def calibrate(
        out: Annotated[Path, typer.Argument(help="The calibration file to write (JSON).")],
        sources: Annotated[
            list[Path],
            typer.Option(
                "--from",
                help="A `rollstream export --topic rewards` JSONL of a run, a "
                "`rollstream eval --json` figure (with --samples K its counts, and the "
                "greedy outcomes), or an earlier calibration file (its counts are added); "
                "repeatable.",
            ),
        ],
        model: Annotated[str, typer.Option(help="The model the counts are of.")] = "",
        temperature: Annotated[
            float | None, typer.Option(help="The sampling temperature of the counts.")
        ] = None,
    ) -> None:
        """Per-task pass rates of a model from its scored samples, for feeder.calibration
        (tasks measured outside feeder.pass_band are not fed)."""
        from services.suites import calibration

        cal = calibration.Calibration(model, temperature)
        try:
            for src in sources:
                n = calibration.from_file(src, cal)
                cal.sources.append(src.name)
                typer.echo(f"{src}: {n} counted")
        except (OSError, ValueError) as exc:
            typer.echo(f"rollstream calibrate: {exc}", err=True)
            raise typer.Exit(2) from exc
        out.write_text(json.dumps(cal.to_json(), indent=1) + "\n")
        rates = [p / n for p, n in cal.tasks.values() if n]
        zero = sum(1 for r in rates if r == 0)
        typer.echo(f"{out}: {len(cal.tasks)} tasks, {zero} never passed, "
                   f"{sum(1 for r in rates if r == 1)} always passed")  # fmt: skip
