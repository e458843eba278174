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

import os
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

ENV_PREFIX = "ROLLSTREAM__"
CONFIG_ENV = "ROLLSTREAM_CONFIG"
DEFAULT_CONFIG_FILE = Path("rollstream.toml")


def _xdg(var: str, fallback: str) -> Path:
    base = os.environ.get(var)
    return Path(base) if base else Path.home() / fallback


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)


class KafkaSettings(Section):
    bootstrap: str | None = None
    """Bootstrap servers of an existing cluster. Unset: rollstream runs a local broker."""
    version: str = "4.4.0"
    """Apache Kafka version fetched from Maven Central for the local broker (pinned)."""
    port: int = 9092
    """Client port of the local broker (bound to 127.0.0.1 only)."""
    controller_port: int = 9093
    """KRaft controller port of the local broker (bound to 127.0.0.1 only)."""
    heap: str = "768m"
    """JVM max heap of the local broker."""
    start_timeout_s: float = 90.0
    """How long `rollstream up` waits for the local broker to answer."""

    @property
    def managed(self) -> bool:
        """True when rollstream runs the broker itself (no bootstrap configured)."""
        return self.bootstrap is None

    @property
    def endpoint(self) -> str:
        return self.bootstrap or f"127.0.0.1:{self.port}"


class RedisSettings(Section):
    url: str | None = None
    """URL of an existing Redis. Unset: rollstream uses or starts one on 127.0.0.1."""
    port: int = 6379
    """Port of the local Redis (bound to 127.0.0.1 only)."""

    @property
    def managed(self) -> bool:
        return self.url is None

    @property
    def endpoint(self) -> str:
        return self.url or f"redis://127.0.0.1:{self.port}/0"


class DockerSettings(Section):
    host: str | None = None
    """Docker engine address (like DOCKER_HOST). Unset: use the local engine, start it if
    needed."""
    socket: str = "/var/run/docker.sock"
    """Socket of the local engine that rollstream uses or starts."""
    install: bool = True
    """Install Debian's docker.io with apt-get when no dockerd binary exists (needs root)."""
    start_timeout_s: float = 60.0
    """How long `rollstream up` waits for a dockerd it started."""

    @property
    def managed(self) -> bool:
        return self.host is None

    @property
    def endpoint(self) -> str:
        return self.host or f"unix://{self.socket}"


class SandboxSettings(Section):
    image: str = "rollstream-sandbox"
    """Repository name of the sandbox image; the tag is derived from its recipe."""
    build: Literal["auto", "dockerfile", "debootstrap"] = "auto"
    """How to build the image: docker build when the base can be pulled, else debootstrap."""
    debian_suite: str = "bookworm"
    """Debian release of the sandbox root filesystem."""
    debian_mirror: str | None = None
    """Debian mirror for debootstrap. Unset: the first one in this machine's apt sources."""
    pull_timeout_s: float = 30.0
    """How long `auto` waits for the Dockerfile base image pull before using debootstrap."""


class TopicsSettings(Section):
    prefix: str = "rollstream"
    """Topic prefix of this run: every topic is `{prefix}.{name}`."""
    partitions: int = Field(default=4, ge=1, le=256)
    """Partitions of the group-keyed topics (trajectories, sandbox.results, rewards)."""


class BlobsSettings(Section):
    """Claim check: where payloads over the inline limit go (DESIGN.md section 2)."""

    inline_limit_bytes: int = Field(default=256 * 1024, ge=1024)
    """Encoded messages larger than this travel as a blob reference."""


class StackSettings(Section):
    state_dir: Path = Field(
        default_factory=lambda: _xdg("XDG_STATE_HOME", ".local/state") / "rollstream"
    )
    """Where the local stack keeps data, logs and pid files."""
    cache_dir: Path = Field(default_factory=lambda: _xdg("XDG_CACHE_HOME", ".cache") / "rollstream")
    """Where downloads (Kafka jars, image build trees) are cached."""


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


def _config_file() -> Path | None:
    named = os.environ.get(CONFIG_ENV)
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
    """Build the settings from every layer. ``config`` names a TOML file (like --config)."""
    if config is not None:
        os.environ[CONFIG_ENV] = str(config)
    return Settings(**parse_overrides(overrides or []))


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
        return str(value)
    return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'
