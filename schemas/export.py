"""JSON Schema of every message, for producers and consumers written in other languages.

``write(directory)`` writes ``<Schema>.schema.json`` per message (draft 2020-12, from
``msgspec.json.schema``, with each field's docstring as its description) and a README
explaining the wire format. JSON Schema describes the *shape*; the wire is MessagePack,
and the README says how the two map onto each other.
"""

from __future__ import annotations

import ast
import inspect
import itertools
import json
import textwrap
from functools import cache
from pathlib import Path
from typing import Any, Final

import msgspec

from schemas.codec import DEFAULT, Codec, schema_name
from schemas.envelope import Message

DIALECT: Final = "https://json-schema.org/draft/2020-12/schema"


@cache
def _class_field_docs(cls: type) -> dict[str, str]:
    """Attribute docstrings (a string literal right after an annotated field) of a class."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    except (OSError, TypeError):
        return {}
    body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
    docs: dict[str, str] = {}
    for node, following in itertools.pairwise(body):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and isinstance(following, ast.Expr)
            and isinstance(following.value, ast.Constant)
            and isinstance(following.value.value, str)
        ):
            docs[node.target.id] = " ".join(following.value.value.split())
    return docs


def field_docs(cls: type) -> dict[str, str]:
    """Field docstrings of a struct, inherited ones included (the envelope's)."""
    docs: dict[str, str] = {}
    for base in reversed(cls.__mro__):
        if isinstance(base, type) and issubclass(base, msgspec.Struct):
            docs.update(_class_field_docs(base))
    return docs


def json_schema(cls: type[Message], codec: Codec = DEFAULT) -> dict[str, Any]:
    """The JSON Schema document of one message type."""
    doc = msgspec.json.schema(cls)
    for name, definition in doc.get("$defs", {}).items():
        struct = _struct_named(cls, name)
        if struct is not None:
            _describe_fields(definition, field_docs(struct))
    out: dict[str, Any] = {
        "$schema": DIALECT,
        "title": schema_name(cls),
        "x-rollstream-version": codec.current_version(cls),
        "x-rollstream-wire": "MessagePack map; see README.md",
    }
    out.update(doc)
    return out


def _describe_fields(definition: dict[str, Any], docs: dict[str, str]) -> None:
    for prop, schema in definition.get("properties", {}).items():
        if prop in docs:
            schema["description"] = docs[prop]


def _struct_named(root: type, name: str) -> type | None:
    """The struct type called `name` among `root` and the types it references."""
    seen: set[type] = set()
    stack: list[type] = [root]
    while stack:
        cls = stack.pop()
        if cls in seen:
            continue
        seen.add(cls)
        if cls.__name__ == name:
            return cls
        for f in msgspec.structs.fields(cls):
            stack.extend(_struct_types(f.type))
    return None


def _struct_types(tp: Any) -> list[type]:
    if isinstance(tp, type) and issubclass(tp, msgspec.Struct):
        return [tp]
    return [t for arg in getattr(tp, "__args__", ()) for t in _struct_types(arg)]


def write(directory: str | Path, codec: Codec = DEFAULT) -> list[Path]:
    """Write every message's schema and the README into `directory`; return the paths."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, cls in sorted(codec.schemas.items()):
        path = out / f"{name}.schema.json"
        path.write_text(json.dumps(json_schema(cls, codec), indent=2, sort_keys=False) + "\n")
        paths.append(path)
    readme = out / "README.md"
    readme.write_text(readme_text(codec))
    paths.append(readme)
    return paths


def readme_text(codec: Codec = DEFAULT) -> str:
    rows = "\n".join(
        f"| `{name}` | {codec.current_version(cls)} | `{name}.schema.json` |"
        for name, cls in sorted(codec.schemas.items())
    )
    return README.replace("{rows}", rows)


README: Final = """\
# rollstream message schemas

One JSON Schema (draft 2020-12) per message. The schemas describe each message's shape,
field by field, with who writes and who reads each field. On the wire, though, every
message is **MessagePack**, not JSON.

| schema | version | file |
|---|---|---|
{rows}

## Wire format

- A message is one MessagePack **map** whose keys are the schema's property names.
- **Tagging**: the key `schema` holds the message's name (`"Trajectory"`); readers
  dispatch on it. It is required.
- **Envelope** on every message: `v` (version; write the `x-rollstream-version` of the
  schema you follow; a missing `v` is read as the reader's current version), `id` (a
  UUIDv7 string: time-ordered, and the idempotency key: never reuse one), `created_at`
  (Unix seconds, float), `origin` (`live` | `replay` | `production`), `parent_id`
  (lineage, or nil).
- **Binary fields**: properties with `"contentEncoding": "base64"` are MessagePack
  **bin** values on the wire (bin 8/16/32), never base64 strings. Strings are UTF-8 str.
- **Packed arrays**: a bin property with `"x-rollstream-packed"` holds consecutive
  fixed-width numbers with no header: `int32-le` (little-endian int32, 4 bytes each),
  `float32-le` (little-endian IEEE-754 float32), or `uint8`. In Python:
  `struct.pack("<%di" % len(ids), *ids)`; NumPy: `np.asarray(x, "<i4").tobytes()`.
- **Alignment**: a packed array with `"x-rollstream-aligned-with": "completion_tokens"`
  has exactly one element per completion token (logprobs, per-token policy versions, the
  completion mask), or is nil / empty where the schema allows.
- **Ordering**: an integer with `"x-rollstream-less-than": "group_size"` is smaller than
  that field of the same message.
- Numbers: integers are MessagePack ints; float properties accept ints or floats (written
  as float64). Rewards, advantages and scores must be finite.
- Enums are strings (`"passed"`, `"live"` ...). Optional properties may be omitted; nil
  is written for a property whose type allows `null`.
- Unknown keys are ignored by readers, so adding keys is how schemas evolve; a breaking
  change gets a new `v`. Readers accept every older version.

## Limits

An encoded message is at most 64 MiB. Kafka records are smaller: messages over the
inline limit (256 KiB by default) are stored in the blob store and the record carries a
`BlobRef` (SHA-256 and size of the encoded message, its store and key, the inner schema
name); readers verify the hash before decoding the blob.

## Example (Python with only `msgpack`)

```python
import msgpack, struct, time, uuid
ids = [101, 7, 42]
record = {
    "schema": "Trajectory", "v": 1, "id": str(uuid.uuid4()),  # UUIDv7 preferred: sorts by time
    "created_at": time.time(),
    "origin": "production", "task_id": "t1", "group_id": "g1", "group_size": 1,
    "verifier": {"name": "exact", "answer": "42"},
    "completion_tokens": struct.pack("<%di" % len(ids), *ids),
    "behaviour_logprobs": struct.pack("<%df" % len(ids), -0.1, -0.2, -0.3),
}
value = msgpack.packb(record, use_bin_type=True)
```
"""
