"""Pure bookkeeping of the service loop: which offsets are done, which ids were seen."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field


class OffsetTracker:
    """Per partition, the next offset such that every earlier record is fully handled
    (trained on, dropped, masked or dead-lettered). Records waiting in a batch hold it back.
    """

    def __init__(self, start: dict[int, int] | None = None) -> None:
        self._next: dict[int, int] = dict(start or {})
        self._open: dict[int, set[int]] = {}

    def seen(self, partition: int, offset: int) -> None:
        """A record was read; it is open until `done`."""
        self._open.setdefault(partition, set()).add(offset)
        self._next[partition] = max(self._next.get(partition, 0), offset + 1)

    def done(self, partition: int, offset: int) -> None:
        self._open.get(partition, set()).discard(offset)

    def committable(self) -> dict[int, int]:
        """Next offset to consume per partition, safe to commit and to checkpoint."""
        return {p: min(self._open.get(p) or {n}) for p, n in self._next.items()}

    @property
    def open(self) -> int:
        return sum(len(v) for v in self._open.values())


class DedupWindow:
    """The most recent `size` ids, in insertion order (a bounded idempotency window)."""

    def __init__(self, size: int, ids: Iterable[str] = ()) -> None:
        self.size = size
        self._ids: OrderedDict[str, None] = OrderedDict()
        for i in ids:
            self.add(i)

    def add(self, item: str) -> None:
        self._ids[item] = None
        self._ids.move_to_end(item)
        while len(self._ids) > self.size:
            self._ids.popitem(last=False)

    def __contains__(self, item: object) -> bool:
        return item in self._ids

    def __len__(self) -> int:
        return len(self._ids)

    def to_list(self) -> list[str]:
        return list(self._ids)


class OutboxProducer:
    """A producer that only appends to the learner's outbox (for publish_dead_letter)."""

    def __init__(self, items: list[tuple[str, bytes | None, bytes]]) -> None:
        self.items = items

    async def send_and_wait(
        self, topic: str, value: bytes | None = None, key: bytes | None = None
    ) -> object:
        self.items.append((topic, key, value or b""))
        return None


@dataclass
class Summary:
    """What a run of the loop did (returned by `Learner.run`)."""

    steps: int = 0
    version: int = -1
    counts: dict[str, int] = field(default_factory=dict)
    tokens: int = 0
    wall_s: float = 0.0
    wait_s: float = 0.0
    train_s: float = 0.0
    publish_s: float = 0.0
    checkpoint_s: float = 0.0
    restore_s: float = 0.0
    """Start-up (checkpoint, announced version, first publication); not in wall_s."""

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.train_s if self.train_s else 0.0

    @property
    def wait_frac(self) -> float:
        return self.wait_s / self.wall_s if self.wall_s else 0.0
