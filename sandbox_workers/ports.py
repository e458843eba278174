"""What the sandbox worker needs from the outside, as small Protocols (DESIGN.md section 10).

services/sandbox_wiring.py passes the real adapters (Kafka through services/kafka.py, the
run's claim check, the image and Docker engine of the stack); tests may pass fakes. This
package never imports services.

A partition is a plain `(topic, partition)` tuple here (aiokafka's TopicPartition is one).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Protocol, TypeVar

from schemas.envelope import Message
from schemas.records import ConsumedRecord

T = TypeVar("T", bound=Message)
Partition = tuple[str, int]
"""(topic, partition)."""
Revoked = Callable[[list[Partition]], Awaitable[None]]
"""Called before partitions leave this worker (a rebalance)."""


Incoming = ConsumedRecord
"""A consumed request record (services.kafka.Record fits)."""


@dataclass
class Publish:
    """A result record for the results topic."""

    key: bytes
    value: bytes


@dataclass
class DeadLetter:
    """An undecodable request record for the dead-letter topic, with the reason."""

    record: Incoming
    reason: str
    error: BaseException | None = None


class Fenced(Exception):
    """Another live worker holds this worker's transactional id, or its consumer group
    generation is no longer current (its partitions moved): nothing it sends commits."""


class WorkerIO(Protocol):
    """The worker's Kafka IO: consume the requests in the sandbox workers' group
    (read_committed, manual commits); publish outputs and the consumed offsets in one
    transaction (exactly-once)."""

    def session(self, on_revoked: Revoked) -> AbstractAsyncContextManager[None]:
        """Start the transactional producer, then join the group; leave and stop on exit."""
        ...

    async def fetch(self, max_records: int, timeout_ms: int) -> list[Incoming]:
        """Up to `max_records` records, in offset order per partition."""
        ...

    async def answered(self, partitions: Sequence[Partition]) -> dict[Partition, set[int]]:
        """Per partition: the offsets its group's last commit marks answered (its metadata,
        schemas/answered.py; malformed metadata counts as none)."""
        ...

    async def publish(
        self,
        outputs: Sequence[Publish | DeadLetter],
        offsets: Mapping[Partition, tuple[int, str]],
    ) -> None:
        """One transaction: every output, then `offsets` (per partition: the next record to
        consume and the commit's metadata) as the group's commit. Raises Fenced when a newer
        worker took the transactional id."""
        ...


class ClaimChecks(Protocol):
    """The run's claim check (schemas.claimcheck.ClaimCheck fits): a store outage raises
    anything but SchemaError, so the worker retries instead of dead-lettering."""

    async def pack(self, msg: Message) -> bytes: ...

    async def unpack(self, data: bytes, expected: type[T]) -> T: ...


class SandboxHost(Protocol):
    """Where the sandbox containers run: the image to start and the Docker engine."""

    def image_ref(self) -> str: ...

    def docker_endpoint(self) -> str: ...
