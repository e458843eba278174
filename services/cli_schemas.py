"""CLI commands of the schemas area; registered on the root app by services/cli.py.
Heavy imports stay inside the command functions (`rollstream --help` must stay instant)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

schemas_app = typer.Typer(
    help="Message schemas: list them, export JSON Schema for other languages.",
    no_args_is_help=True,
)


@schemas_app.command("export")
def export_cmd(
    directory: Annotated[
        Path, typer.Argument(metavar="DIR", help="Directory to write (created if missing).")
    ],
) -> None:
    """Write one JSON Schema per message and a README on the MessagePack wire format."""
    from schemas import export

    paths = export.write(directory)
    typer.echo(f"wrote {len(paths) - 1} schemas and README.md to {directory}")


@schemas_app.command("list")
def list_cmd() -> None:
    """Every message schema with its version and the topics that carry it."""
    from schemas import codec, topics

    carried: dict[str, list[str]] = {}
    for spec in topics.ALL:
        for name in spec.schemas:
            carried.setdefault(name, []).append(spec.name)
    width = max(len(n) for n in codec.SCHEMAS)
    typer.echo(f"{'schema':<{width}}  v  topics")
    for name, cls in codec.SCHEMAS.items():
        where = ", ".join(carried.get(name, [])) or (
            "any (claim check)" if name == "BlobRef" else "-"
        )
        typer.echo(f"{name:<{width}}  {codec.DEFAULT.current_version(cls)}  {where}")


def register(app: typer.Typer) -> None:
    """Add this area's commands to the root app."""
    app.add_typer(schemas_app, name="schemas")
