"""The architecture check (tests/architecture.py): the tree passes, and small trees that
break each rule are caught."""

from __future__ import annotations

from pathlib import Path

from tests import architecture

ROOT = Path(__file__).resolve().parents[2]


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    for pkg in architecture.PACKAGES:
        (tmp_path / pkg).mkdir(parents=True, exist_ok=True)
        (tmp_path / pkg / "__init__.py").write_text("")
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path


def _rules(root: Path) -> set[str]:
    return {v.rule for v in architecture.check(root)}


def test_the_tree_passes() -> None:
    problems = architecture.check(ROOT)
    assert problems == [], "\n".join(map(str, problems))


def test_a_small_clean_tree_passes(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        {
            "schemas/a.py": "X = 1\n",
            "learner/b.py": "from schemas.a import X\n",
            "services/c.py": "from learner import b\nfrom schemas import a\n",
        },
    )
    assert architecture.check(root) == []


def test_lower_package_importing_services_is_caught_even_lazily(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        {
            "services/s.py": "Y = 1\n",
            "streams/t.py": (
                "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                "    from services.s import Y\n"
            ),
            "learner/u.py": "def f():\n    import services.s\n    return services.s\n",
        },
    )
    found = [v for v in architecture.check(root) if v.rule == "layer"]
    assert {v.path for v in found} == {"streams/t.py", "learner/u.py"}


def test_schemas_importing_a_package_above_is_caught(tmp_path: Path) -> None:
    root = _tree(tmp_path, {"learner/x.py": "", "schemas/y.py": "from learner import x\n"})
    assert "layer" in _rules(root)


def test_import_cycles_are_caught_also_through_lazy_and_relative_imports(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        {
            "services/a.py": "from services import b\n",
            "services/b.py": "def f():\n    from .c import g\n    return g\n",
            "services/c.py": "def g():\n    from services.a import h\n",
        },
    )
    cycles = [v for v in architecture.check(root) if v.rule == "cycle"]
    assert len(cycles) == 1
    assert cycles[0].detail == "services.a <-> services.b <-> services.c"


def test_package_cycles_are_caught(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        {
            "streams/a.py": "from sandbox_workers import b\n",
            "sandbox_workers/b.py": "X = 1\n",
            "sandbox_workers/c.py": "from streams import a\n",
        },
    )
    assert {"package-cycle", "layer"} <= _rules(root)


def test_size_limits(tmp_path: Path) -> None:
    long_fn = "def f():\n" + "    x = 1\n" * architecture.MAX_FUNCTION_LINES + "    return x\n"
    big = "X = 1\n" * (architecture.MAX_MODULE_LINES + 1)
    root = _tree(tmp_path, {"learner/long.py": long_fn, "services/big.py": big})
    found = {(v.path, v.rule) for v in architecture.check(root)}
    assert ("learner/long.py", "function-size") in found
    assert ("services/big.py", "module-size") in found


def test_main_exit_status(tmp_path: Path) -> None:
    assert architecture.main([str(_tree(tmp_path, {}))]) == 0
    bad = _tree(tmp_path, {"schemas/z.py": "import services\n"})
    assert architecture.main([str(bad)]) == 1
