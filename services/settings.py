"""The one settings model of rollstream.

Layers, lowest to highest: field defaults < TOML file < environment < CLI.

- TOML: the file named by ``--config`` or ``ROLLSTREAM_CONFIG``, else ``./rollstream.toml``
  when present. Sections are the nested models below (``[kafka]``, ``[redis]`` ...).
- Environment: ``ROLLSTREAM__SECTION__KEY=value`` (for example
  ``ROLLSTREAM__KAFKA__BOOTSTRAP=broker:9092``).
- CLI: ``rollstream --set section.key=value`` (repeatable) and the flags of each command.

``rollstream config show`` prints the merged result and where it came from.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from pydantic import Field, SecretStr
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from learner.config import LearnerSettings
from sandbox_workers.config import PENALTY_FIELDS, RewardsSettings, SandboxSettings
from services.config import (
    DEMO_OVERRIDES,
    BlobsSettings,
    DemoSettings,
    DockerSettings,
    KafkaSettings,
    RedisSettings,
    ReplaySettings,
    StackSettings,
    TopicsSettings,
)
from services.ingest.config import IngestSettings
from services.rollout.config import FeederSettings, GeneratorSettings
from streams.config import DispatcherSettings

__all__ = [
    "CONFIG_ENV",
    "DEMO_OVERRIDES",
    "ENV_PREFIX",
    "PENALTY_FIELDS",
    "BlobsSettings",
    "DemoSettings",
    "DispatcherSettings",
    "DockerSettings",
    "FeederSettings",
    "GeneratorSettings",
    "IngestSettings",
    "KafkaSettings",
    "LearnerSettings",
    "RedisSettings",
    "ReplaySettings",
    "RewardsSettings",
    "SandboxSettings",
    "Settings",
    "StackSettings",
    "TopicsSettings",
    "load",
    "parse_overrides",
    "render_toml",
]

ENV_PREFIX = "ROLLSTREAM__"
CONFIG_ENV = "ROLLSTREAM_CONFIG"
DEFAULT_CONFIG_FILE = Path("rollstream.toml")


class Settings(BaseSettings):
    """All of rollstream's configuration; one nested section per service."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        env_nested_delimiter="__",
        extra="forbid",
        use_attribute_docstrings=True,
        validate_default=True,
    )

    kafka: KafkaSettings = Field(default_factory=KafkaSettings)
    """Kafka cluster (or the local broker)."""
    redis: RedisSettings = Field(default_factory=RedisSettings)
    """Redis (blob store, dedup keys)."""
    docker: DockerSettings = Field(default_factory=DockerSettings)
    """Docker engine that runs the sandboxes."""
    sandbox: SandboxSettings = Field(default_factory=SandboxSettings)
    """Sandbox image."""
    topics: TopicsSettings = Field(default_factory=TopicsSettings)
    """Topic names and sizes."""
    blobs: BlobsSettings = Field(default_factory=BlobsSettings)
    """Claim-check blob store."""
    dispatcher: DispatcherSettings = Field(default_factory=DispatcherSettings)
    """Reward dispatcher."""
    rewards: RewardsSettings = Field(default_factory=RewardsSettings)
    """Reward map from sandbox outcomes."""
    learner: LearnerSettings = Field(default_factory=LearnerSettings)
    """Asynchronous off-policy learner."""
    ingest: IngestSettings = Field(default_factory=IngestSettings)
    """Ingest gateway for production traces and feedback."""
    replay: ReplaySettings = Field(default_factory=ReplaySettings)
    """Replay and export of topics and log files."""
    generator: GeneratorSettings = Field(default_factory=GeneratorSettings)
    """Rollout generators."""
    feeder: FeederSettings = Field(default_factory=FeederSettings)
    """Task feeder."""
    demo: DemoSettings = Field(default_factory=DemoSettings)
    """`rollstream demo`."""
    stack: StackSettings = Field(default_factory=StackSettings)
    """Local stack state."""

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        toml_file = _config_file()
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        if toml_file is not None:
            sources.append(TomlConfigSettingsSource(settings_cls, toml_file=toml_file))
        return tuple(sources)


_CONFIG_OVERRIDE: Path | None = None
"""The file `load(config=...)` names, for the duration of that call."""


def _config_file() -> Path | None:
    named = str(_CONFIG_OVERRIDE) if _CONFIG_OVERRIDE else os.environ.get(CONFIG_ENV)
    if named:
        path = Path(named)
        if not path.is_file():
            raise FileNotFoundError(f"{CONFIG_ENV}={named}: no such config file")
        return path
    return DEFAULT_CONFIG_FILE if DEFAULT_CONFIG_FILE.is_file() else None


def parse_overrides(pairs: list[str]) -> dict[str, Any]:
    """Turn ``["kafka.port=19092", ...]`` into nested init kwargs (the CLI layer)."""
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--set {pair!r}: expected section.key=value")
        parts = key.strip().split(".")
        node = out
        for part in parts[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ValueError(f"--set {pair!r}: {part} is set twice")
            node = child
        node[parts[-1]] = value
    return out


def load(overrides: list[str] | None = None, config: Path | None = None) -> Settings:
    """Build the settings from every layer. ``config`` names a TOML file (like --config);
    without it, ROLLSTREAM_CONFIG or ./rollstream.toml."""
    global _CONFIG_OVERRIDE
    _CONFIG_OVERRIDE = config
    try:
        return Settings(**parse_overrides(overrides or []))
    finally:
        _CONFIG_OVERRIDE = None


def render_toml(settings: Settings) -> str:
    """The merged settings as a TOML document, one table per section, docstrings as comments."""
    lines: list[str] = []
    for section_name, section_field in Settings.model_fields.items():
        section = getattr(settings, section_name)
        lines.append(f"[{section_name}]  # {section_field.description or ''}".rstrip(" #"))
        for key, f in type(section).model_fields.items():
            value = getattr(section, key)
            if f.description:
                lines.append(f"# {f.description}".replace("\n", " "))
            lines.append(
                f"{key} = {_toml_value(value)}" if value is not None else f"# {key} = (unset)"
            )
        lines.append("")
    return "\n".join(lines)


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, dict):
        items = ", ".join(f"{_toml_value(str(k))} = {_toml_value(v)}" for k, v in value.items())
        return "{ " + items + " }" if items else "{}"
    if isinstance(value, list | tuple | set | frozenset):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, SecretStr):
        return '"**********"  # secret: not shown'
    return json.dumps(str(value))  # a JSON string is a valid TOML basic string
