"""What a consumed Kafka record offers its reader, as a Protocol: the one record shape the
lower packages type against (learner/io.py, sandbox_workers/ports.py) and services/kafka.py
implements (its `Record`, or an aiokafka ConsumerRecord). No Kafka client here."""

from __future__ import annotations

from typing import Protocol


class ConsumedRecord(Protocol):
    """A record as read from a topic."""

    @property
    def topic(self) -> str: ...
    @property
    def partition(self) -> int: ...
    @property
    def offset(self) -> int: ...
    @property
    def key(self) -> bytes | None: ...
    @property
    def value(self) -> bytes | None: ...
