"""What the reward dispatcher needs from the outside (DESIGN.md section 10).

The faust app is the dispatcher's engine and lives here (streams/app.py); everything
else comes in through `Wiring`, which services/dispatcher_wiring.py builds from the
settings: the broker, the run's topic prefix and partition count, the state directory,
the claim check, and the producer of tick records. This package never imports services.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, TypeVar

from schemas.envelope import Message

T = TypeVar("T", bound=Message)


class ClaimChecks(Protocol):
    """The run's claim check (schemas.claimcheck.ClaimCheck fits)."""

    async def pack(self, msg: Message, inline_limit: int | None = None) -> bytes:
        """The record value: `msg`, or a BlobRef when over the limit (0: always)."""
        ...

    async def unpack(self, data: bytes, expected: type[T]) -> T: ...

    async def aclose(self) -> None: ...


class Ticks(Protocol):
    """A plain producer of tick records (outside any faust event), started on first use."""

    async def send(self, topic: str, keys: list[bytes]) -> None:
        """One empty record per key on `topic`, flushed before returning."""
        ...

    async def close(self) -> None: ...


@dataclass(frozen=True)
class Wiring:
    """Where the dispatcher of one run connects."""

    brokers: list[str]
    """Kafka bootstrap servers, host:port each."""
    prefix: str
    """The run's topic prefix (settings topics.prefix)."""
    partitions: int
    """Partition count of the group-keyed topics (settings topics.partitions)."""
    state_dir: Path
    """The stack's state directory; faust keeps its data under dispatcher/{prefix}."""
    claim_check: ClaimChecks
    ticks: Ticks
    replication: int = 1
    """Replication factor of the faust table's changelog topic (settings
    dispatcher.changelog_replication, else the cluster's)."""
