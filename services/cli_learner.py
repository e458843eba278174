"""CLI of the learner; registered on the root app by services/cli.py. Heavy imports (torch,
aiokafka) stay inside the command, so `rollstream --help` stays instant."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Annotated

import typer

if TYPE_CHECKING:
    from learner.bookkeeping import Summary
    from services.settings import Settings


def register(app: typer.Typer) -> None:
    """Add `rollstream learner`."""

    @app.command()
    def learner(
        ctx: typer.Context,
        prefix: Annotated[str | None, typer.Option(help="Topic prefix (topics.prefix).")] = None,
        policy: Annotated[str | None, typer.Option(help="Policy name (learner.policy).")] = None,
        device: Annotated[
            str | None, typer.Option(help="auto | cpu | cuda | cuda:N (learner.device).")
        ] = None,
        metrics_port: Annotated[
            int | None, typer.Option(help="Prometheus port on 127.0.0.1 (0: off).")
        ] = None,
        max_steps: Annotated[
            int | None, typer.Option(help="Stop at this many optimizer steps in total.")
        ] = None,
        max_seconds: Annotated[
            float | None, typer.Option(help="Stop after this many seconds.")
        ] = None,
        idle_exit: Annotated[
            float | None,
            typer.Option(help="Stop after this many seconds without new rewards."),
        ] = None,
        nproc: Annotated[
            int | None,
            typer.Option(help="Data-parallel ranks on this host (learner.nproc; torchrun-like)."),
        ] = None,
        log_level: Annotated[str, typer.Option(help="Python log level.")] = "info",
    ) -> None:
        """Run the asynchronous off-policy learner: rewards -> updates -> weights + ledger."""
        from services.cli_common import settings_from

        _logging(log_level)
        overrides = {
            "topics.prefix": prefix,
            "learner.policy": policy,
            "learner.device": device,
            "learner.metrics_port": metrics_port,
            "learner.nproc": nproc,
        }
        settings = settings_from(ctx, **overrides)
        if settings.learner.nproc > 1 and "WORLD_SIZE" not in os.environ:
            import sys

            from services.learner_launch import launch

            raise typer.Exit(launch(settings.learner.nproc, sys.argv[1:]))
        _run(settings, max_steps=max_steps, max_seconds=max_seconds, idle_exit_s=idle_exit)


def _logging(level: str) -> None:
    import logging

    logging.basicConfig(
        level=level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    logging.getLogger("aiokafka").setLevel(logging.WARNING)


def _run(
    settings: Settings,
    *,
    max_steps: int | None,
    max_seconds: float | None,
    idle_exit_s: float | None,
) -> None:
    """Run the learner service and print its summary as one JSON line."""
    import asyncio

    from services.learner_service import run_service

    summary = asyncio.run(
        run_service(settings, max_steps=max_steps, max_seconds=max_seconds, idle_exit_s=idle_exit_s)
    )
    if os.environ.get("RANK", "0") == "0":  # the other ranks of a data-parallel job: quiet
        typer.echo(_summary_json(summary))
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        _exit_rank()


def _exit_rank() -> None:
    """End a rank of a data-parallel job now that its work is done and its output flushed.
    The process group is destroyed by then, yet collective threads of the C++ runtime can
    outlive it and abort the interpreter's finalisation ("terminate called without an
    active exception", exit 250), turning a finished job into a failed one."""
    import logging
    import sys

    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _summary_json(summary: Summary) -> str:
    import json

    return json.dumps(
        {
            "steps": summary.steps,
            "version": summary.version,
            "samples": summary.counts,
            "tokens_per_s": round(summary.tokens_per_s, 1),
            "wait_frac": round(summary.wait_frac, 3),
        }
    )
