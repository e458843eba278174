"""CLI of the reward dispatcher; registered on the root app by services/cli.py."""

from __future__ import annotations

from typing import Annotated

import typer


def register(app: typer.Typer) -> None:
    """Add `rollstream dispatcher`."""

    @app.command()
    def dispatcher(
        ctx: typer.Context,
        prefix: Annotated[str | None, typer.Option(help="Topic prefix (topics.prefix).")] = None,
        metrics_port: Annotated[
            int | None, typer.Option(help="Prometheus port on 127.0.0.1 (0: off).")
        ] = None,
    ) -> None:
        """Run the reward dispatcher: trajectories -> sandbox -> rewards (a faust worker)."""
        import asyncio

        from services.cli_common import settings_from
        from services.dispatcher_wiring import run
        from services.topics import cluster_replication

        settings = settings_from(
            ctx, **{"topics.prefix": prefix, "dispatcher.metrics_port": metrics_port}
        )
        if not settings.dispatcher.changelog_replication:
            rf = asyncio.run(cluster_replication(settings))
            dispatcher = settings.dispatcher.model_copy(update={"changelog_replication": rf})
            settings = settings.model_copy(update={"dispatcher": dispatcher})
        run(settings)
