"""Taking a partition over (sandbox_workers/service.py `_take_over`): the records the last
owner's commit marks answered are not run again, and records fetched before a revocation
that interleaves with reading that commit are not started."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sandbox_workers.config import SandboxSettings
from sandbox_workers.ports import Partition
from sandbox_workers.service import SandboxWorker

A, B = ("req", 0), ("req", 1)


@dataclass
class _Record:
    topic: str
    partition: int
    offset: int
    key: bytes | None = None
    value: bytes | None = b"x"


class _IO:
    """WorkerIO whose commit read may let a rebalance revoke partitions meanwhile."""

    def __init__(self, done: dict[Partition, set[int]], revoke: list[Partition]) -> None:
        self.done, self.revoke = done, revoke
        self.asked: list[list[Partition]] = []
        self.worker: SandboxWorker | None = None

    async def answered(self, partitions: Sequence[Partition]) -> dict[Partition, set[int]]:
        self.asked.append(list(partitions))
        if self.revoke and self.worker is not None:
            await self.worker._revoked(self.revoke)
        return {p: self.done.get(p, set()) for p in partitions}


def _worker(io: _IO) -> SandboxWorker:
    w = SandboxWorker(SandboxSettings(), io, None, "w", None, None)  # type: ignore[arg-type]
    io.worker = w
    return w


async def test_answered_records_are_not_run_again_and_the_commit_is_read_once() -> None:
    io = _IO({A: {5, 7}}, revoke=[])
    w = _worker(io)
    records = [_Record(*A, o) for o in (4, 5, 6)]
    assert await w._take_over(records) == records
    assert [w.outbox.add(A, o).outputs for o in (4, 5, 6, 7)] == [None, [], None, []]
    assert await w._take_over([_Record(*A, 8)]) and io.asked == [[A]]  # known now


async def test_records_of_a_partition_revoked_meanwhile_are_not_started() -> None:
    io = _IO({A: {3}, B: {9}}, revoke=[A])
    w = _worker(io)
    kept = await w._take_over([_Record(*A, 3), _Record(*B, 8), _Record(*A, 4)])
    assert [(r.partition, r.offset) for r in kept] == [(1, 8)]
    assert not w.outbox.known(A) and w.outbox.known(B)
    assert w.outbox.add(B, 9).outputs == []
