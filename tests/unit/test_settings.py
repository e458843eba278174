import tomllib
from pathlib import Path

import pytest
from pydantic import ValidationError

from services.settings import CONFIG_ENV, Settings, load, parse_overrides, render_toml


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for key in list(__import__("os").environ):
        if key.startswith("ROLLSTREAM"):
            monkeypatch.delenv(key)
    monkeypatch.chdir(tmp_path)  # no ./rollstream.toml unless a test writes one


def test_defaults() -> None:
    s = load()
    assert s.kafka.managed and s.kafka.endpoint == "127.0.0.1:9092"
    assert s.redis.endpoint == "redis://127.0.0.1:6379/0"
    assert s.topics.prefix == "rollstream"


def test_layers_toml_then_env_then_cli(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    cfg = tmp_path / "rollstream.toml"
    cfg.write_text('[topics]\nprefix = "from-toml"\npartitions = 3\n[kafka]\nport = 1111\n')
    s = load()
    assert (s.topics.prefix, s.topics.partitions, s.kafka.port) == ("from-toml", 3, 1111)

    monkeypatch.setenv("ROLLSTREAM__TOPICS__PREFIX", "from-env")
    s = load()
    assert (s.topics.prefix, s.topics.partitions) == ("from-env", 3)

    s = load(["topics.prefix=from-cli"])
    assert (s.topics.prefix, s.topics.partitions, s.kafka.port) == ("from-cli", 3, 1111)


def test_named_config_file(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    cfg = tmp_path / "other.toml"
    cfg.write_text('[redis]\nurl = "redis://10.0.0.1:6379/0"\n')
    s = load(config=cfg)
    assert not s.redis.managed and s.redis.endpoint == "redis://10.0.0.1:6379/0"
    monkeypatch.setenv(CONFIG_ENV, str(tmp_path / "missing.toml"))
    with pytest.raises(FileNotFoundError, match=r"missing\.toml"):
        load()


def test_configured_endpoint_is_not_managed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ROLLSTREAM__KAFKA__BOOTSTRAP", "broker:9092")
    s = load()
    assert not s.kafka.managed and s.kafka.endpoint == "broker:9092"


@pytest.mark.parametrize("bad", ["novalue", "=x", ""])
def test_bad_override_is_a_clear_error(bad: str) -> None:
    with pytest.raises(ValueError, match=r"section\.key=value"):
        parse_overrides([bad])


def test_unknown_and_invalid_keys_are_rejected(tmp_path: Path) -> None:
    with pytest.raises(ValidationError):
        load(["kafka.no_such_key=1"])
    with pytest.raises(ValidationError):
        load(["topics.partitions=0"])
    with pytest.raises(ValidationError):
        load(["sandbox.build=magic"])


def test_render_toml_round_trips(tmp_path: Path) -> None:
    s = load(["kafka.bootstrap=b:1", "topics.partitions=7", "docker.install=false"])
    text = render_toml(s)
    tomllib.loads(text)  # valid TOML
    (tmp_path / "rollstream.toml").write_text(text)
    again = load()
    assert again.model_dump() == s.model_dump()


def test_every_field_is_documented() -> None:
    for section in Settings.model_fields.values():
        assert section.description, section
        for name, f in section.annotation.model_fields.items():  # type: ignore[union-attr]
            assert f.description, f"{section.annotation.__name__}.{name} has no docstring"
