"""Shared fixtures. Directory decides the marker: tests/integration -> integration,
tests/e2e -> e2e. Integration and e2e tests need the stack `make test` brings up."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        parts = Path(str(item.fspath)).relative_to(ROOT / "tests").parts
        if parts[0] in ("integration", "e2e"):
            item.add_marker(getattr(pytest.mark, parts[0]))


@pytest.fixture
def prefix() -> str:
    """A topic prefix of this test alone, so tests never see each other's messages."""
    return f"t{uuid.uuid4().hex[:12]}"
