"""Integration fixtures: the real Kafka, Redis and Docker engine of the local stack."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from services.infra import docker_engine
from services.settings import Settings, load


@pytest.fixture(scope="session")
def settings() -> Settings:
    return load()


@pytest.fixture(scope="session")
def _stack_up(settings: Settings) -> None:
    from services.infra import stack

    down = [c for c in stack.doctor(settings) if not c.healthy and c.component != "topics"]
    if down:
        lines = "\n".join(f"  {c.component}: {c.detail} ({c.fix})" for c in down)
        pytest.fail(f"the local stack is not up; run `make up` (or `rollstream up`):\n{lines}")


@pytest.fixture
def docker_client(settings: Settings, _stack_up: None) -> Iterator[object]:
    """A Docker client; fails the test if it leaves a labelled sandbox container behind."""
    client = docker_engine.client(settings)
    before = {
        c.id for c in client.containers.list(all=True, filters={"label": "rollstream.sandbox"})
    }
    yield client
    after = {
        c.id for c in client.containers.list(all=True, filters={"label": "rollstream.sandbox"})
    }
    leaked = after - before
    for cid in leaked:
        client.containers.get(cid).remove(force=True)
    client.close()
    assert not leaked, f"test leaked sandbox containers: {leaked}"
