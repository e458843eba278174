"""`rollstream dispatcher`: run the reward dispatcher as a faust worker until SIGTERM/SIGINT
(services/dispatcher_wiring.py builds the app and calls `run`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import faust

    from streams.config import DispatcherSettings


def run(app: faust.App, section: DispatcherSettings) -> None:
    """Start the faust worker (blocks; faust handles SIGTERM and SIGINT gracefully)."""
    from faust import Worker

    port = section.metrics_port
    if port:
        from prometheus_client import start_http_server

        start_http_server(port, addr="127.0.0.1")
    worker = Worker(app, loglevel=section.log_level.upper(), quiet=True, redirect_stdouts=False)
    worker.execute_from_commandline()
