"""Upgrade hooks: how a reader turns an older version of a message into the current one.

Evolution rules (DESIGN.md section 2): add optional fields only; never reuse or retype a
name. Such additive changes need no hook: the codec decodes the older bytes directly and
the new fields take their defaults. A breaking change bumps the struct's ``v`` default
and registers one hook per step here, keyed by (schema name, version it upgrades FROM)::

    @hook("Trajectory", 1)
    def _trajectory_1_to_2(d: dict[str, Any]) -> None:
        d["completion_tokens"] = d.pop("tokens", b"")

A hook edits the raw decoded map in place (MessagePack map -> dict; bin -> bytes); the
codec then applies the next step and finally validates against the current struct.
Hooks must be pure and must not raise on any map a previous writer could have produced;
if one raises, the codec reports a SchemaError naming the step. Record every breaking
change in CHANGELOG.md.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

Upgrade = Callable[[dict[str, Any]], None]
"""Upgrades a raw message map by one version, in place."""

UPGRADES: Final[dict[tuple[str, int], Upgrade]] = {}
"""(schema name, from version) -> hook. Empty: every schema is still at version 1."""


def hook(schema: str, from_version: int) -> Callable[[Upgrade], Upgrade]:
    """Register `fn` as the upgrade of `schema` from `from_version` to the next version."""

    def register(fn: Upgrade) -> Upgrade:
        key = (schema, from_version)
        if key in UPGRADES:
            raise ValueError(f"two upgrade hooks for {schema} v{from_version}")
        UPGRADES[key] = fn
        return fn

    return register
