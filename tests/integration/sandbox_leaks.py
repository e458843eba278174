"""Leak checks scoped to what a test itself started: other sessions may run sandbox
workers on the same engine at the same time, so "no new labelled container" would lie."""

from __future__ import annotations

from collections.abc import Iterable

from sandbox_workers.hardening import SANDBOX_LABEL
from sandbox_workers.reaper import OWNER_LABEL, POOL_LABEL
from services.infra import docker_engine
from services.settings import Settings


def _labels(settings: Settings) -> list[dict[str, str]]:
    client = docker_engine.client(settings)
    try:
        found = client.containers.list(all=True, filters={"label": SANDBOX_LABEL})
        return [dict(c.labels or {}) for c in found]
    finally:
        client.close()


def owned_by(settings: Settings, pids: Iterable[int]) -> list[dict[str, str]]:
    """Sandbox containers whose owning process is one of `pids` (alive or not)."""
    wanted = {str(p) for p in pids}
    return [lb for lb in _labels(settings) if lb.get(OWNER_LABEL, "::").split(":")[1] in wanted]


def of_pool(settings: Settings, pool_id: str) -> list[dict[str, str]]:
    return [lb for lb in _labels(settings) if lb.get(POOL_LABEL) == pool_id]
