"""`rollstream schemas export`, and a producer that knows only `msgpack` and the exported
JSON Schema: it builds maps by walking the schema file, and rollstream reads them."""

from __future__ import annotations

import json
import re
import struct
from pathlib import Path
from typing import Any

import msgpack
import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from schemas import codec, export
from schemas.messages import Trajectory


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from services.cli import app

    out = tmp_path_factory.mktemp("schemas")
    result = CliRunner().invoke(app, ["schemas", "export", str(out)])
    assert result.exit_code == 0, result.output
    assert "wrote 11 schemas" in result.output
    return out


def test_export_writes_a_schema_per_message_and_a_readme(exported: Path) -> None:
    names = {p.name for p in exported.iterdir()}
    assert names == {f"{n}.schema.json" for n in codec.SCHEMAS} | {"README.md"}
    doc = json.loads((exported / "Trajectory.schema.json").read_text())
    assert doc["$schema"] == export.DIALECT and doc["x-rollstream-version"] == 1
    props = doc["$defs"]["Trajectory"]["properties"]
    assert props["schema"] == {"enum": ["Trajectory"]}
    assert "writer: generator; reader: learner" in props["prompt_tokens"]["description"]
    assert props["prompt_tokens"]["x-rollstream-packed"] == "int32-le"
    readme = (exported / "README.md").read_text()
    assert "MessagePack" in readme and "`Trajectory` | 1 |" in readme


def test_every_field_is_documented(exported: Path) -> None:
    for path in exported.glob("*.schema.json"):
        for name, definition in json.loads(path.read_text())["$defs"].items():
            for prop, schema in definition.get("properties", {}).items():
                if prop != "schema" and "enum" not in definition:
                    assert schema.get("description"), f"{path.name}: {name}.{prop} undocumented"


def test_schemas_list_names_topics() -> None:
    from services.cli import app

    result = CliRunner().invoke(app, ["schemas", "list"])
    assert result.exit_code == 0, result.output
    assert re.search(r"Trajectory\s+1\s+trajectories", result.output)
    assert re.search(r"BlobRef\s+1\s+any \(claim check\)", result.output)


def test_readme_example_produces_a_readable_trajectory(exported: Path) -> None:
    readme = (exported / "README.md").read_text()
    code = readme.split("```python\n", 1)[1].split("```", 1)[0]
    scope: dict[str, Any] = {}
    exec(compile(code, "README.md", "exec"), scope)
    traj = codec.decode(scope["value"], Trajectory)
    assert list(struct.unpack("<3i", traj.completion_tokens)) == [101, 7, 42]
    assert traj.origin == "production" and traj.verifier.answer == "42"


# -- a producer built from the JSON Schema alone ---------------------------------------


class SchemaWalker:
    """Draws MessagePack-ready values from a JSON Schema document, following the README's
    wire rules: base64 strings are bin; x-rollstream-packed bins are packed arrays;
    x-rollstream-aligned-with arrays share the completion-token count; `v` is the
    document's x-rollstream-version."""

    def __init__(self, doc: dict[str, Any], draw: st.DrawFn) -> None:
        self.doc, self.defs, self.draw = doc, doc["$defs"], draw
        self.tokens = draw(st.integers(0, 40))
        self.targets = set(_values_of(doc, "x-rollstream-aligned-with"))

    def value(self, node: dict[str, Any]) -> Any:
        if "$ref" in node:
            return self.value(self.defs[node["$ref"].rsplit("/", 1)[1]])
        if "anyOf" in node:
            return self.value(self.draw(st.sampled_from(node["anyOf"])))
        if "enum" in node:
            return self.draw(st.sampled_from(node["enum"]))
        kind = node.get("type")
        if kind == "object":
            return self.obj(node)
        if kind == "array":
            return [self.value(node["items"]) for _ in range(self.draw(st.integers(0, 2)))]
        if kind == "string" and node.get("contentEncoding") == "base64":
            return self.binary(node)
        if kind == "string":
            return self.string(node)
        if kind == "integer":
            return self.draw(st.integers(node.get("minimum", -(2**63)), node.get("maximum", 2**31)))
        if kind == "number":
            return self.draw(st.floats(allow_nan=False, allow_infinity=False))
        if kind == "boolean":
            return self.draw(st.booleans())
        assert kind == "null", node
        return None

    def string(self, node: dict[str, Any]) -> str:
        if "pattern" in node:
            return self.draw(st.from_regex(node["pattern"], fullmatch=True))
        low, high = node.get("minLength", 0), node.get("maxLength", 30)
        return self.draw(st.text(min_size=low, max_size=min(high, 30)))

    def binary(self, node: dict[str, Any], aligned: bool = False) -> bytes:
        packed = node.get("x-rollstream-packed")
        aligned = aligned or "x-rollstream-aligned-with" in node
        n = self.tokens if aligned else self.draw(st.integers(0, 9))
        if packed == "uint8":
            return self.draw(st.binary(min_size=n, max_size=n))
        if packed == "int32-le":
            values = self.draw(st.lists(st.integers(-(2**31), 2**31 - 1), min_size=n, max_size=n))
            return struct.pack(f"<{n}i", *values)
        if packed == "float32-le":
            values = self.draw(st.lists(st.floats(width=32), min_size=n, max_size=n))
            return struct.pack(f"<{n}f", *values)
        return self.draw(st.binary(max_size=20))

    def obj(self, node: dict[str, Any]) -> dict[str, Any]:
        if "properties" not in node:  # a map: additionalProperties
            keys = self.draw(st.lists(st.text(max_size=8), max_size=2, unique=True))
            return {k: self.value(node["additionalProperties"]) for k in keys}
        out: dict[str, Any] = {}
        for prop, sub in node["properties"].items():
            if prop in self.targets:  # what the aligned arrays align with
                out[prop] = self.binary(sub, aligned=True)
            elif prop in node.get("required", []) or self.draw(st.booleans()):
                out[prop] = self.value(sub)
        if "v" in node["properties"] and node["title"] == self.doc["title"]:
            out["v"] = self.doc["x-rollstream-version"]
        for prop, sub in node["properties"].items():
            other = sub.get("x-rollstream-less-than")
            if other and prop in out:
                out[prop] = self.draw(st.integers(0, out[other] - 1))
        return out


def _values_of(node: Any, key: str) -> list[Any]:
    if isinstance(node, dict):
        own = [node[key]] if key in node else []
        return own + [v for sub in node.values() for v in _values_of(sub, key)]
    if isinstance(node, list):
        return [v for sub in node for v in _values_of(sub, key)]
    return []


def assert_written_fields_read_back(written: Any, read: Any, path: str = "$") -> None:
    """Every value the producer wrote comes back (defaults may fill the rest)."""
    if isinstance(written, dict):
        for key, value in written.items():
            assert key in read, f"{path}.{key} missing"
            assert_written_fields_read_back(value, read[key], f"{path}.{key}")
    elif isinstance(written, list):
        assert len(written) == len(read), path
        for i, (w, r) in enumerate(zip(written, read, strict=True)):
            assert_written_fields_read_back(w, r, f"{path}[{i}]")
    else:
        assert written == read and type(written) is type(read), f"{path}: {written!r} != {read!r}"


@st.composite
def trajectory_maps(draw: st.DrawFn, doc: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = SchemaWalker(doc, draw).value(doc)
    return out


TRAJECTORY_DOC = json.loads(json.dumps(export.json_schema(Trajectory)))  # as read from a file


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(trajectory_maps(TRAJECTORY_DOC))
def test_msgpack_only_producer_writes_trajectories_rollstream_reads(record: dict[str, Any]) -> None:
    traj = codec.decode(msgpack.packb(record, use_bin_type=True), Trajectory)
    assert_written_fields_read_back(record, msgspec.to_builtins(traj, builtin_types=(bytes,)))
    assert traj.n_completion_tokens == len(record["completion_tokens"]) // 4


def test_walker_reads_the_exported_file(exported: Path) -> None:
    assert json.loads((exported / "Trajectory.schema.json").read_text()) == TRAJECTORY_DOC
