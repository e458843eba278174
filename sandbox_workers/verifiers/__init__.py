"""Verifier plugins (see base.py): python_tests, stdin_stdout, math_answer, exact, regex."""

from __future__ import annotations

from sandbox_workers.regex_guard import RegexGuard
from sandbox_workers.verifiers.base import (
    InProcessVerifier,
    Registry,
    SandboxedVerifier,
    Verdict,
    Verifier,
)
from sandbox_workers.verifiers.math_answer import MathAnswer
from sandbox_workers.verifiers.sandboxed import PythonTests, StdinStdout, feedback_spec
from sandbox_workers.verifiers.text import Exact, Regex

__all__ = [
    "Exact",
    "InProcessVerifier",
    "MathAnswer",
    "PythonTests",
    "Regex",
    "Registry",
    "SandboxedVerifier",
    "StdinStdout",
    "Verdict",
    "Verifier",
    "default_registry",
    "feedback_spec",
]


def default_registry(guard: RegexGuard | None = None) -> Registry:
    """Every built-in verifier."""
    return Registry([PythonTests(), StdinStdout(), MathAnswer(), Exact(), Regex(guard)])
