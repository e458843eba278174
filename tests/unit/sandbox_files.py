"""Import the executor's modules (deploy/sandbox/files, standard library only) in tests,
without writing bytecode next to them (that would change the sandbox image's recipe)."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType

FILES = Path(__file__).resolve().parents[2] / "deploy" / "sandbox" / "files"


def load(name: str) -> ModuleType:
    before = sys.dont_write_bytecode
    sys.dont_write_bytecode = True
    if str(FILES) not in sys.path:
        sys.path.insert(0, str(FILES))
    try:
        return importlib.import_module(name)
    finally:
        sys.dont_write_bytecode = before
