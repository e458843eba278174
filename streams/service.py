"""`rollstream dispatcher`: run the reward dispatcher as a faust worker until SIGTERM/SIGINT."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from services.settings import Settings


def run(settings: Settings) -> None:
    """Start the faust worker (blocks; faust handles SIGTERM and SIGINT gracefully)."""
    from faust import Worker

    from streams.app import build_app

    app, _ = build_app(settings)
    port = settings.dispatcher.metrics_port
    if port:
        from prometheus_client import start_http_server

        start_http_server(port, addr="127.0.0.1")
    worker = Worker(
        app, loglevel=settings.dispatcher.log_level.upper(), quiet=True, redirect_stdouts=False
    )
    worker.execute_from_commandline()
