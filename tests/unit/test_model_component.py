"""The `model` component of `rollstream up` / `doctor` and `services.models.resolved`,
without fetching anything (tiny and local directories)."""

from __future__ import annotations

from pathlib import Path

from services.infra import models, stack
from services.models import is_pretrained, resolved
from services.settings import load


def test_tiny_needs_nothing() -> None:
    s = load()
    assert "model" in stack.COMPONENTS and not is_pretrained(s)
    probe = models.probe(s)
    assert probe.healthy and probe.version == "tiny"
    up = models.up(s)
    assert up.healthy and up.detail.startswith("reused")
    assert resolved(s) is s.learner


def test_a_local_directory_resolves_to_itself(tmp_path: Path) -> None:
    missing = load([f"learner.model=hf:{tmp_path}"])
    check = models.probe(missing)
    assert not check.healthy and "config.json" in check.detail and check.fix
    (tmp_path / "config.json").write_text("{}")
    s = load([f"learner.model=hf:{tmp_path}"])
    assert models.probe(s).healthy
    section = resolved(s)
    assert section.model == str(tmp_path) and section.lr == s.learner.lr


def test_a_missing_gguf_is_reported_not_fetched(tmp_path: Path) -> None:
    s = load([f"learner.model=gguf:{tmp_path / 'none.gguf'}", f"stack.cache_dir={tmp_path}"])
    check = models.probe(s)
    assert not check.healthy and check.detail == "not fetched" and "--only model" in check.fix
