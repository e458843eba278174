"""Constrained field types shared by the message structs.

Constraints (``msgspec.Meta``) are checked when bytes are decoded, not when a struct is
constructed in Python; ``codec.validate(msg)`` checks a constructed message. The
``x-rollstream-*`` keywords land in the exported JSON Schema so that producers in other
languages learn the wire rules JSON Schema cannot say (schemas/export.py).
"""

from __future__ import annotations

from typing import Annotated, Final

import msgspec

MAX_GROUP_SIZE: Final = 4096
"""Largest group a task may ask for; larger ones are almost surely a unit mistake."""

PACKED_KEY: Final = "x-rollstream-packed"
"""JSON Schema keyword: the bytes field holds a packed array of this element type."""
ALIGNED_KEY: Final = "x-rollstream-aligned-with"
"""JSON Schema keyword: this packed array has one element per element of the named one."""
LESS_THAN_KEY: Final = "x-rollstream-less-than"
"""JSON Schema keyword: this integer is smaller than the named integer field."""

PackedI32 = Annotated[bytes, msgspec.Meta(extra_json_schema={PACKED_KEY: "int32-le"})]
"""Packed little-endian int32 values (schemas/arrays.py)."""


PerTokenI32 = Annotated[
    bytes,
    msgspec.Meta(extra_json_schema={PACKED_KEY: "int32-le", ALIGNED_KEY: "completion_tokens"}),
]
"""Packed little-endian int32, one per completion token."""
PerTokenF32 = Annotated[
    bytes,
    msgspec.Meta(extra_json_schema={PACKED_KEY: "float32-le", ALIGNED_KEY: "completion_tokens"}),
]
"""Packed little-endian float32, one per completion token."""
PerTokenU8 = Annotated[
    bytes,
    msgspec.Meta(extra_json_schema={PACKED_KEY: "uint8", ALIGNED_KEY: "completion_tokens"}),
]
"""One byte per completion token."""

Key = Annotated[str, msgspec.Meta(min_length=1, max_length=256)]
"""A non-empty identifier that may serve as a Kafka key."""
Count = Annotated[int, msgspec.Meta(ge=0)]
"""A non-negative count or index."""
GroupSize = Annotated[int, msgspec.Meta(ge=1, le=MAX_GROUP_SIZE)]
"""Completions sampled per task (the group of group-relative advantages)."""
Sha256Hex = Annotated[str, msgspec.Meta(pattern="^[0-9a-f]{64}$")]
"""Lowercase hex SHA-256 digest."""
