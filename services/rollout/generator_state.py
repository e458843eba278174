"""What a generator holds: its started parts, its summary, and its groups' member ids."""

from __future__ import annotations

import hashlib
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

    from learner.policy import Policy
    from schemas.claimcheck import ClaimCheck
    from services.rollout.textcodec import TextCodec


@dataclass
class Summary:
    groups: int = 0
    trajectories: int = 0
    tokens: int = 0
    versions: dict[int, int] = field(default_factory=dict)
    """Trajectories per policy version they started with."""
    swaps: int = 0
    weight_failures: int = 0
    inflight_swaps: int = 0
    """Swaps between two decoding steps of a running batch."""
    paced_s: float = 0.0
    max_outstanding: int = 0
    """The most trajectories outstanding when a group was admitted (pacing's view)."""
    dead_letters: int = 0


@dataclass
class Parts:
    """What a started generator samples, reads and publishes with."""

    policy: Policy
    codec: TextCodec
    rng: torch.Generator
    claim: ClaimCheck
    producer: AIOKafkaProducer
    consumer: AIOKafkaConsumer


def member_id(group_id: str, index: int) -> str:
    """The id of member `index` of a group: the same in every sampling of the group. A
    UUIDv7 when group_id is one (its time prefix is kept, so ids still sort by time)."""
    digest = hashlib.sha256(f"{group_id}/{index}".encode()).digest()
    try:
        head = uuid.UUID(group_id).bytes[:8]
    except ValueError:
        head = digest[8:16]
    tail = bytes([0x80 | (digest[0] & 0x3F)]) + digest[1:8]
    return str(uuid.UUID(bytes=head + tail))
