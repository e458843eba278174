"""The service loop against an in-memory Kafka double: fates, ledger, offsets, versions,
and a crash (an exception mid-run) followed by a restart from the checkpoint."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import pytest
import torch

from learner import signal
from learner.bookkeeping import DedupWindow, OffsetTracker
from learner.checkpoint import CheckpointManager
from learner.config import LearnerSettings, configure
from learner.loop import Learner, LoopConfig
from learner.synthetic import scored
from learner.tiny import TinyConfig, TinyPolicy
from learner.trainer import Trainer, train_config
from learner.weights import DirWeightStore
from schemas import codec
from schemas.messages import DeadLetter, LedgerEntry, ScoredTrajectory, WeightUpdate
from services.kafka import Record

torch.set_num_threads(1)
CFG = TinyConfig(vocab_size=16, dim=16, layers=1, heads=2, max_seq_len=24, eos_id=14, pad_id=15)
TOPICS = {"rewards_topic": "p.rewards", "weights_topic": "p.weights"}


class FakeIO:
    """Topics as lists; the rewards topic has partitions; offsets and commits in memory."""

    def __init__(self, rewards: dict[int, list[bytes | None]]) -> None:
        self.rewards = rewards
        self.pos = {p: 0 for p in rewards}
        self.committed: dict[int, int] = {}
        self.topics: dict[str, list[tuple[bytes | None, bytes | None]]] = defaultdict(list)

    async def seek(self, offsets: dict[int, int]) -> None:
        for p in self.rewards:
            self.pos[p] = offsets.get(p, self.committed.get(p, 0))

    async def poll(self, timeout_s: float, max_records: int) -> list[Record]:
        out = []
        for p, values in self.rewards.items():
            while self.pos[p] < len(values) and len(out) < 3:  # small polls
                out.append(Record("p.rewards", p, self.pos[p], 0, b"k", values[self.pos[p]]))
                self.pos[p] += 1
        return out

    async def commit(self, offsets: dict[int, int]) -> None:
        self.committed.update(offsets)

    async def send_and_wait(
        self, topic: str, value: bytes | None = None, key: bytes | None = None
    ) -> object:
        self.topics[topic].append((key, value))
        return None

    async def send_all(self, items: list[tuple[str, bytes | None, bytes]]) -> None:
        for topic, key, value in items:
            self.topics[topic].append((key, value))

    async def last_value(self, topic: str, key: bytes) -> bytes | None:
        values = [v for k, v in self.topics[topic] if k == key]
        return values[-1] if values else None


class Boom(Exception):
    pass


def _learner(io: FakeIO, root: Path, crash_at: int | None = None, **cfg: object) -> Learner:
    torch.manual_seed(0)
    trainer = Trainer(TinyPolicy(CFG), train_config(LearnerSettings(lr=1e-3)), torch.device("cpu"))
    if crash_at is not None:
        step = trainer.step

        def crashing(samples):  # type: ignore[no-untyped-def]
            if trainer.steps >= crash_at:
                raise Boom
            return step(samples)

        trainer.step = crashing  # type: ignore[method-assign]
    loop_cfg = configure(
        LoopConfig,
        LearnerSettings(),
        policy="pi",
        ledger_topic="p.ledger",
        dlq_topic="p.dlq",
        batch_tokens=12,
        batch_max_wait_s=0.05,
        poll_s=0.0,
        idle_exit_s=0.2,
        **TOPICS,
        **cfg,  # type: ignore[arg-type]
    )

    async def unpack(data: bytes) -> ScoredTrajectory:
        return codec.decode(data, ScoredTrajectory)

    return Learner(
        loop_cfg,
        trainer,
        DirWeightStore(root / "weights", "pi"),
        CheckpointManager(root / "ckpt"),
        io,  # type: ignore[arg-type]
        unpack,
    )


def _msg(i: int, version: int = 0, **kw: object) -> bytes:
    return codec.encode(
        scored([1, 2], [3, 4, 5, 6], advantage=1.0 - 2 * (i % 2), logprobs=[-1.0] * 4,
               version=version, group_id=f"g{i // 2}", group_size=2, index=i % 2,
               **kw)  # type: ignore[arg-type]
    )  # fmt: skip


def _ledger(io: FakeIO) -> list[LedgerEntry]:
    return [codec.decode(v, LedgerEntry) for _, v in io.topics["p.ledger"] if v is not None]


async def test_every_record_gets_its_fate(tmp_path: Path) -> None:
    good = [_msg(i, version=11) for i in range(8)]
    stale = codec.encode(scored([1], [3, 4], advantage=1.0, logprobs=[-1.0, -1.0], version=3))
    masked = _msg(20, masked=True)
    too_long = codec.encode(scored([1] * 30, [2], advantage=1.0, logprobs=[-1.0], version=11))
    io = FakeIO({0: [*good[:4], good[1], b"\x00garbage", masked], 1: [*good[4:], too_long, stale]})
    # a previous run announced version 10: a fresh learner continues after it
    update = WeightUpdate(policy="pi", version=10, step=99, uri="file:///x", sha256="0" * 64,
                          size_bytes=1)  # fmt: skip
    io.topics["p.weights"].append((b"pi", codec.encode(update)))
    learner = _learner(io, tmp_path)
    summary = await learner.run()
    assert summary.counts == {
        "trained": 8, "duplicate": 1, "dead_letter": 1, "masked": 1, "dropped": 2,
    }  # fmt: skip
    entries = _ledger(io)
    by_status = defaultdict(list)
    for e in entries:
        by_status[e.status.value].append(e)
    assert len({e.trajectory_id for e in entries}) == len(entries) == 11
    reasons = sorted(e.reason for e in by_status["dropped"])
    assert reasons[1] == "too long: 31 tokens > max_seq_len 24"
    assert reasons[0].startswith("stale: lag ") and reasons[0].endswith(" > max_lag 4")
    assert all(e.learner_step >= 1 and e.policy_version == 11 for e in by_status["trained"])
    assert by_status["masked"][0].reason.startswith("sandbox_error")
    letter = codec.decode(io.topics["p.dlq"][0][1] or b"", DeadLetter)
    assert letter.original == b"\x00garbage" and letter.source_offset == 5
    assert io.committed == {0: 7, 1: 6}
    updates = [codec.decode(v or b"", WeightUpdate) for _, v in io.topics["p.weights"]]
    assert [u.version for u in updates] == list(range(10, 16))  # 11: the fresh start
    assert summary.version == 15 and updates[-1].step == summary.steps == 4
    assert 8 <= updates[-1].samples_consumed <= learner.samples_consumed == 11


async def test_crash_and_restart_resumes_from_the_checkpoint(tmp_path: Path) -> None:
    msgs = [_msg(i) for i in range(24)]
    io = FakeIO({0: msgs[:12], 1: msgs[12:]})
    with pytest.raises(Boom):
        await _learner(io, tmp_path, crash_at=5, checkpoint_every=2, max_lag=99).run()
    before = len(_ledger(io))
    assert before == 8  # 4 steps checkpointed; the 5th batch was read but never trained
    ckpt = CheckpointManager(tmp_path / "ckpt").list()[-1]
    assert CheckpointManager.is_flushed(ckpt)
    summary = await _learner(io, tmp_path, checkpoint_every=2, max_lag=99).run()
    entries = _ledger(io)
    assert sorted(e.trajectory_id for e in entries) == sorted(
        codec.decode(m, ScoredTrajectory).trajectory_id for m in msgs
    )  # each exactly once
    assert summary.steps == 12 and summary.counts == {"trained": 16}
    versions = [codec.decode(v or b"", WeightUpdate).version for _, v in io.topics["p.weights"]]
    assert versions == sorted(set(versions))  # strictly increasing across the crash
    assert io.committed == {0: 12, 1: 12}


def test_offset_tracker_holds_back_at_open_records() -> None:
    t = OffsetTracker({0: 5})
    assert t.committable() == {0: 5}
    for off in (5, 6, 7):
        t.seen(0, off)
    t.done(0, 5)
    t.done(0, 7)
    assert t.committable() == {0: 6} and t.open == 1
    t.done(0, 6)
    assert t.committable() == {0: 8}


def test_dedup_window_is_bounded() -> None:
    w = DedupWindow(2, ["a", "b"])
    w.add("c")
    assert "a" not in w and "b" in w and "c" in w and w.to_list() == ["b", "c"]


def flat_member(i: int) -> ScoredTrajectory:
    return scored([1, 2], [3, 4], advantage=0.0, logprobs=[-1.0] * 2, group_id="flat",
                  group_size=2, index=i)  # fmt: skip


@pytest.mark.parametrize("skip", [True, False])
async def test_samples_without_signal_are_settled_untrained(tmp_path: Path, skip: bool) -> None:
    flat = [  # a group whose rewards were all equal: advantage 0 for both members
        codec.encode(flat_member(i)) for i in range(2)
    ]
    trace = codec.encode(scored([1, 2], [3, 4], advantage=0.0, version=-1))  # no behaviour
    io = FakeIO({0: [*flat, trace, _msg(0), _msg(1)]})
    summary = await _learner(io, tmp_path, skip_no_signal=skip).run()
    fates = {e.trajectory_id: (e.status.value, e.reason) for e in _ledger(io)}
    assert len(fates) == 5
    flat_ids = [codec.decode(m, ScoredTrajectory).trajectory_id for m in flat]
    if skip:
        assert summary.counts == {"trained": 3, "dropped": 2}
        assert all(fates[t] == ("dropped", signal.NO_SIGNAL) for t in flat_ids)
    else:
        assert summary.counts == {"trained": 5}
    trace_id = codec.decode(trace, ScoredTrajectory).trajectory_id
    assert fates[trace_id][0] == "trained"  # the reward-weighted term has a gradient at A = 0


async def test_a_kl_term_keeps_samples_of_advantage_zero(tmp_path: Path) -> None:
    flat = codec.encode(scored([1, 2], [3, 4], advantage=0.0, logprobs=[-1.0] * 2))
    io = FakeIO({0: [flat, _msg(0)]})
    learner = _learner(io, tmp_path, kl_coef=0.1)
    assert (await learner.run()).counts == {"trained": 2}
