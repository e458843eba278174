"""Retry with backoff for the dispatcher's IO (the blob store, Kafka sends).

A transient failure (a Redis blip, a Kafka timeout, a connection reset) is retried with
capped exponential backoff until it succeeds: the record it belongs to is good and must
not go to the DLQ. Anything else propagates (bad data raises SchemaError before this)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Final, TypeVar

log = logging.getLogger("rollstream.dispatcher")
T = TypeVar("T")

TRANSIENT_NAMES: Final = frozenset(
    {
        "ConnectionError",
        "TimeoutError",
        "BusyLoadingError",
        "KafkaTimeoutError",
        "KafkaConnectionError",
        "NodeNotReadyError",
        "RequestTimedOutError",
        "NotLeaderForPartitionError",
        "LeaderNotAvailableError",
        "NotEnoughReplicasError",
        "NotEnoughReplicasAfterAppendError",
    }
)
"""Exception class names (anywhere in the MRO) that mean "try again" (redis, aiokafka and
the standard library name them so; this package imports neither client)."""


def is_transient(exc: BaseException) -> bool:
    """Whether `exc` is an infrastructure hiccup worth retrying."""
    if isinstance(exc, OSError | TimeoutError | asyncio.TimeoutError):
        return True
    if getattr(exc, "retriable", False) is True:
        return True
    return any(cls.__name__ in TRANSIENT_NAMES for cls in type(exc).__mro__)


async def retrying(
    fn: Callable[[], Awaitable[T]],
    what: str,
    *,
    base_s: float = 0.05,
    cap_s: float = 5.0,
    attempts: int | None = None,
) -> T:
    """`await fn()`, retrying transient failures with backoff (forever when `attempts` is
    None); other exceptions, and the last transient one, propagate."""
    try:
        return await fn()  # the common case: no retry bookkeeping
    except Exception as exc:
        if not is_transient(exc) or attempts == 1:
            raise
        log.warning("%s failed (%r); retrying", what, exc)
    delay, n = base_s, 1
    while True:
        try:
            return await fn()
        except Exception as exc:
            n += 1
            if not is_transient(exc) or (attempts is not None and n >= attempts):
                raise
            log.warning("%s failed (%r); retry %d in %.2fs", what, exc, n, delay)
            await asyncio.sleep(delay)
            delay = min(cap_s, delay * 2)
