"""Run the gateway with uvicorn until SIGTERM/SIGINT (uvicorn stops gracefully)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from services.settings import Settings


def serve(settings: Settings) -> None:
    import uvicorn

    from services.ingest.app import create_app

    level = settings.ingest.log_level.upper()
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("aiokafka").setLevel(logging.WARNING)
    app = create_app(settings)
    if settings.ingest.metrics_port:
        from prometheus_client import start_http_server

        start_http_server(settings.ingest.metrics_port, addr="127.0.0.1")
    config = uvicorn.Config(
        app,
        host=settings.ingest.host,
        port=settings.ingest.port,
        log_level=settings.ingest.log_level.lower(),
        proxy_headers=False,
        server_header=False,
        timeout_graceful_shutdown=10,
    )
    uvicorn.Server(config).run()
