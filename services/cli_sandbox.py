"""CLI commands of the sandbox area; registered on the root app by services/cli.py.
Heavy imports stay inside the command functions (`rollstream --help` must stay instant)."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    """Add this area's commands to the root app."""
