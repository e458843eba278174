"""What every area of the `rollstream` CLI shares: the root options (--config, --set) and
loading the settings with the CLI layer on top. services/cli.py and every
services/cli_*.py import it (never services.cli: the root imports the areas)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

if TYPE_CHECKING:
    from services.settings import Settings


def root_options(
    ctx: typer.Context,
    config: Annotated[
        Path | None,
        typer.Option(
            "--config", metavar="FILE", help="TOML settings file (else ./rollstream.toml)."
        ),
    ] = None,
    set_: Annotated[
        list[str] | None,
        typer.Option(
            "--set", metavar="KEY=VALUE", help="Override a setting: section.key=value (repeatable)."
        ),
    ] = None,
) -> None:
    """The root app's callback: keep the options for `settings_from`."""
    ctx.obj = {"config": config, "set": list(set_ or [])}


def settings_from(ctx: typer.Context, **flags: Any) -> Settings:
    """Load settings with the CLI layer on top: --set pairs, then this command's flags."""
    from pydantic import ValidationError

    from services.settings import CONFIG_ENV, load

    obj = ctx.find_root().obj or {}
    if obj.get("config") is not None:  # services this command starts inherit the file
        os.environ[CONFIG_ENV] = str(Path(obj["config"]).resolve())
    pairs = list(obj.get("set", []))
    pairs += [f"{k}={v}" for k, v in flags.items() if v is not None]
    try:
        return load(pairs, obj.get("config"))
    except (ValidationError, ValueError, FileNotFoundError) as exc:
        typer.echo(f"rollstream: invalid settings:\n{exc}", err=True)
        raise typer.Exit(2) from exc
