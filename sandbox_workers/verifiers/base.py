"""What a verifier plugin is, and the registry the sandbox picks them from.

Two kinds:

- `SandboxedVerifier` (python_tests, stdin_stdout): describes the executor job; the
  judging itself happens inside the sandbox (deploy/sandbox/files/judging.py), so the
  plugin's `version` covers that code too (and the image digest pins it exactly).
- `InProcessVerifier` (math_answer, exact, regex): judges the candidate's answer text (the
  request's `code` field) right in the worker; no candidate code runs.

A plugin bumps `version` whenever a verdict could change. A request naming another
version than the one installed gets sandbox_error (re-scoring with an old version must be
deliberate, with that version deployed).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from schemas.sandbox import Outcome, SandboxRequest, VerifierSpec


@dataclass(frozen=True, slots=True)
class Verdict:
    """An in-process verifier's judgement."""

    outcome: Outcome
    passed: int = 0
    total: int = 1
    detail: str = ""


@runtime_checkable
class SandboxedVerifier(Protocol):
    name: str
    version: str

    def problem(self, spec: VerifierSpec) -> str | None:
        """What makes the task's spec unusable (None: usable)."""

    def job(self, request: SandboxRequest) -> dict[str, Any]:
        """The executor job's mode and inputs (limits are added by the sandbox)."""


@runtime_checkable
class InProcessVerifier(Protocol):
    name: str
    version: str

    def problem(self, spec: VerifierSpec) -> str | None:
        """What makes the task's spec unusable (None: usable)."""

    async def judge(self, answer: str, spec: VerifierSpec) -> Verdict:
        """Judge the candidate's answer text against the spec."""


Verifier = SandboxedVerifier | InProcessVerifier


class Registry:
    """Verifier plugins by name."""

    def __init__(self, plugins: list[Verifier] | None = None) -> None:
        self._plugins: dict[str, Verifier] = {}
        for p in plugins or []:
            self.register(p)

    def register(self, plugin: Verifier) -> None:
        if plugin.name in self._plugins:
            raise ValueError(f"verifier {plugin.name!r} is registered twice")
        self._plugins[plugin.name] = plugin

    def names(self) -> list[str]:
        return sorted(self._plugins)

    def lookup(self, spec: VerifierSpec) -> tuple[Verifier | None, str]:
        """(plugin, "") or (None, why not): unknown name, unavailable version, bad spec."""
        plugin = self._plugins.get(spec.name)
        if plugin is None:
            return None, f"unknown verifier {spec.name!r} (have {', '.join(self.names())})"
        if spec.version is not None and spec.version != plugin.version:
            return None, (
                f"verifier {spec.name} version {spec.version!r} is not deployed "
                f"(this worker has {plugin.version!r})"
            )
        problem = plugin.problem(spec)
        if problem:
            return None, f"invalid {spec.name} spec: {problem}"
        return plugin, ""
