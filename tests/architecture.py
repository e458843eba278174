"""The architecture rules of DESIGN.md section 10, checked over the AST of the tree.

    python -m tests.architecture [ROOT]     # exit 1 and one line per violation

- Layers point down: `schemas` imports none of the other packages; `sandbox_workers`,
  `streams` and `learner` never import `services` (not even under TYPE_CHECKING or inside
  a function).
- No import cycles between modules of the project, counting every import (top level,
  inside functions, under TYPE_CHECKING), and none between its packages.
- Size: no module over MAX_MODULE_LINES lines, no function over MAX_FUNCTION_LINES.

`make lint` runs it; tests/unit/test_architecture.py runs it on the tree and on small
trees that break each rule.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

PACKAGES = ("schemas", "sandbox_workers", "streams", "learner", "services")
"""The project's packages, lowest layer first."""
ALLOWED: dict[str, frozenset[str]] = {
    "schemas": frozenset(),
    "sandbox_workers": frozenset({"schemas"}),
    "streams": frozenset({"schemas", "sandbox_workers"}),
    "learner": frozenset({"schemas"}),
    "services": frozenset(PACKAGES),
}
"""Which other project packages each package may import."""
SIZED = (*PACKAGES, "benchmarks", "deploy")
"""Trees whose modules and functions the size limits apply to."""
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60


@dataclass(frozen=True)
class Violation:
    path: str
    line: int
    rule: str
    detail: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: [{self.rule}] {self.detail}"


def module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(tree: ast.Module, name: str, is_pkg: bool) -> Iterator[tuple[list[str], int]]:
    """Per import statement, the module names it may refer to, most specific first
    (relative imports resolved): `from pkg import mod` is pkg.mod if that is a module,
    else pkg."""
    package = name if is_pkg else name.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield [alias.name], node.lineno
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                yield [f"{base}.{alias.name}", base], node.lineno


def _resolve(target: str, modules: set[str]) -> str | None:
    """The project module `target` names (a name inside a module resolves to the module)."""
    while target:
        if target in modules:
            return target
        target = target.rpartition(".")[0]
    return None


def import_graph(root: Path) -> tuple[dict[str, dict[str, int]], dict[str, Path]]:
    files: dict[str, Path] = {}
    for pkg in PACKAGES:
        for path in sorted((root / pkg).rglob("*.py")):
            files[module_name(root, path)] = path
    modules = set(files)
    graph: dict[str, dict[str, int]] = {}
    for name, path in files.items():
        tree = ast.parse(path.read_text(), str(path))
        edges: dict[str, int] = {}
        for targets, line in _imports(tree, name, path.name == "__init__.py"):
            exact = next((t for t in targets if t in modules), None)
            found = exact or _resolve(targets[-1], modules)
            if found is not None and found != name and not name.startswith(found + "."):
                edges.setdefault(found, line)
        graph[name] = edges
    return graph, files


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def check_imports(root: Path) -> list[Violation]:
    graph, files = import_graph(root)
    out: list[Violation] = []
    pkg_graph: dict[str, set[str]] = {p: set() for p in PACKAGES}
    for name, edges in graph.items():
        pkg = name.split(".")[0]
        for target, line in edges.items():
            tpkg = target.split(".")[0]
            if tpkg == pkg:
                continue
            pkg_graph[pkg].add(tpkg)
            if tpkg not in ALLOWED[pkg]:
                rel = str(files[name].relative_to(root))
                out.append(Violation(rel, line, "layer", f"{name} imports {target}"))
    for comp in _cycles({k: set(v) for k, v in graph.items()}):
        first = comp[0]
        out.append(Violation(str(files[first].relative_to(root)), 1, "cycle", " <-> ".join(comp)))
    for comp in _cycles(pkg_graph):
        out.append(Violation(comp[0], 1, "package-cycle", " <-> ".join(comp)))
    return out


def check_sizes(root: Path) -> list[Violation]:
    out: list[Violation] = []
    for top in SIZED:
        for path in sorted((root / top).rglob("*.py")):
            rel = str(path.relative_to(root))
            text = path.read_text()
            lines = text.count("\n")
            if lines > MAX_MODULE_LINES:
                out.append(Violation(rel, 1, "module-size", f"{lines} lines > {MAX_MODULE_LINES}"))
            for node in ast.walk(ast.parse(text, rel)):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    n = (node.end_lineno or node.lineno) - node.lineno + 1
                    if n > MAX_FUNCTION_LINES:
                        detail = f"{node.name}: {n} lines > {MAX_FUNCTION_LINES}"
                        out.append(Violation(rel, node.lineno, "function-size", detail))
    return out


def check(root: Path) -> list[Violation]:
    return check_imports(root) + check_sizes(root)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    root = Path(args[0] if args else Path(__file__).resolve().parents[1])
    problems = check(root)
    for p in problems:
        print(p)
    print(f"architecture: {len(problems)} violation(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
