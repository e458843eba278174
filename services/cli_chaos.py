"""CLI of `rollstream chaos` (services/chaos.py)."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from services.cli_common import settings_from


def register(app: typer.Typer) -> None:
    @app.command()
    def chaos(
        ctx: typer.Context,
        minutes: Annotated[
            float, typer.Option(min=0.1, help="How long components are killed and restarted.")
        ] = 10.0,
        as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
    ) -> None:
        """Run the tiny pipeline on a stack of its own while SIGKILLing and restarting a
        component every 9 s, in shuffled rounds over all of them (generator, dispatcher,
        sandbox worker, learner, Redis, the Kafka broker; at least 3 rounds) and
        SIGSTOPping the sandbox worker past its session timeout once a round; then drain,
        audit, and print `lost N, trained twice N, conflicts N` with kills and recovery
        times per component. Exit 1 unless all three are 0."""
        import asyncio
        import logging

        from services.chaos import run_chaos

        # its own probes meet a killed broker on purpose: their client's errors are noise
        logging.getLogger("aiokafka").setLevel(logging.CRITICAL)

        report = asyncio.run(run_chaos(settings_from(ctx), minutes))
        if as_json:
            typer.echo(json.dumps(report.to_json(), indent=2))
        else:
            typer.echo(report.line())
            for line in report.recovery_lines():
                typer.echo(f"  {line}")
        raise typer.Exit(0 if report.clean else 1)
