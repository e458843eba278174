"""Shared fixtures. Directory decides the marker: tests/integration -> integration,
tests/e2e -> e2e. Integration and e2e tests need the stack `make test` brings up."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        parts = Path(str(item.fspath)).relative_to(ROOT / "tests").parts
        if parts[0] in ("integration", "e2e"):
            item.add_marker(getattr(pytest.mark, parts[0]))


@pytest.fixture
def prefix() -> Iterator[str]:
    """A topic prefix of this test alone, so tests never see each other's messages.
    The prefix's topics are deleted afterwards (best effort), so runs do not pile up."""
    value = f"t{uuid.uuid4().hex[:12]}"
    yield value
    if os.environ.get("ROLLSTREAM_TEST_KEEP_TOPICS"):  # debugging: inspect them afterwards
        return
    thread = threading.Thread(target=_delete_topics, args=(value,), daemon=True)
    thread.start()
    thread.join(20)


def _delete_topics(prefix: str) -> None:
    from services.infra.common import port_open
    from services.settings import load

    settings = load()
    host, _, port = settings.kafka.endpoint.split(",")[0].rpartition(":")
    if not port_open(host, int(port)):
        return

    async def run() -> None:
        from aiokafka.admin import AIOKafkaAdminClient

        logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
        admin = AIOKafkaAdminClient(bootstrap_servers=settings.kafka.endpoint)
        await admin.start()
        try:
            ours = [t for t in await admin.list_topics() if t.startswith(prefix)]
            if ours:
                await admin.delete_topics(ours)
        finally:
            await admin.close()

    with contextlib.suppress(Exception):
        asyncio.run(asyncio.wait_for(run(), 15))
