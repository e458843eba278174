"""Weight store (directory backend) and checkpoints: integrity, atomicity, exact resume."""

from __future__ import annotations

import hashlib
import os
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from learner.checkpoint import CheckpointManager, CheckpointState
from learner.config import LearnerSettings
from learner.sample import Sample
from learner.tiny import TinyConfig, TinyPolicy
from learner.trainer import Trainer, train_config
from learner.weights import DirWeightStore, WeightIntegrityError, fetch, path_of, serialize

torch.set_num_threads(1)
CFG = TinyConfig(vocab_size=16, dim=16, layers=1, heads=2, max_seq_len=16, eos_id=14, pad_id=15)


def _trainer(seed: int) -> Trainer:
    torch.manual_seed(seed)
    return Trainer(TinyPolicy(CFG), train_config(LearnerSettings(lr=1e-2)), torch.device("cpu"))


def _batch(seed: int) -> list[Sample]:
    rng = np.random.default_rng(seed)
    return [
        Sample(
            trajectory_id=f"{seed}-{i}",
            group_id="g",
            prompt=rng.integers(0, 14, 3).astype(np.int32),
            completion=rng.integers(0, 14, 5).astype(np.int32),
            advantage=float(rng.normal()),
            behaviour_logp=(-rng.random(5) * 3).astype(np.float32),
        )
        for i in range(6)
    ]


def test_dir_store_round_trip_and_integrity(tmp_path: Path) -> None:
    store = DirWeightStore(tmp_path, "pi", keep=2)
    state = TinyPolicy(CFG).weights()
    ref = store.put(3, state)
    assert ref.sha256 == hashlib.sha256(serialize(state)).hexdigest()
    assert ref.size_bytes == path_of(ref.uri).stat().st_size
    got = store.get(ref.uri, ref.sha256)
    assert got.keys() == state.keys() and all(torch.equal(got[k], state[k]) for k in state)
    assert fetch(ref.uri, ref.sha256).keys() == state.keys()  # by uri alone
    with pytest.raises(WeightIntegrityError, match="does not match"):
        store.get(ref.uri, "0" * 64)
    blob = path_of(ref.uri)
    data = bytearray(blob.read_bytes())
    data[-1] ^= 1
    blob.write_bytes(bytes(data))
    with pytest.raises(WeightIntegrityError):
        store.get(ref.uri, ref.sha256)


def test_dir_store_keeps_newest_and_leaves_no_temp_files(tmp_path: Path) -> None:
    store = DirWeightStore(tmp_path, "pi", keep=2)
    refs = [store.put(v, {"w": torch.full((4,), float(v))}) for v in range(4)]
    names = sorted(os.listdir(tmp_path / "pi"))
    assert names == sorted(path_of(r.uri).name for r in refs[2:])
    with pytest.raises(WeightIntegrityError, match="pruned"):
        store.get(refs[0].uri, refs[0].sha256)


def test_checkpoint_resume_is_exact(tmp_path: Path) -> None:
    a = _trainer(0)
    a.step(_batch(1))
    mgr = CheckpointManager(tmp_path, keep=2)
    state = CheckpointState(
        version=7,
        step=a.steps,
        samples_consumed=6,
        offsets={"p.rewards": {0: 12, 3: 4}},
        outbox=[("p.ledger", b"k", b"\x81\xa1a\x01"), ("p.dlq", None, b"\x00")],
        extra={"dedup": ["x", "y"]},
    )
    torch.manual_seed(123)
    random.seed(5)
    np.random.seed(9)
    path = mgr.save(state, a.policy, a.optimizer)  # type: ignore[arg-type]
    for k in (2, 3):
        a.step(_batch(k))
    expect_rng = (torch.rand(3), random.random(), np.random.random())

    b = _trainer(42)  # different init: everything must come from the checkpoint
    loaded = mgr.load_latest(b.policy, b.optimizer)  # type: ignore[arg-type]
    assert loaded is not None and loaded[0] == path
    got = loaded[1]
    assert (got.version, got.step, got.samples_consumed) == (7, 1, 6)
    assert got.offsets == {"p.rewards": {0: 12, 3: 4}} and got.outbox == [
        ("p.ledger", b"k", b"\x81\xa1a\x01"),
        ("p.dlq", None, b"\x00"),
    ]
    assert got.extra == {"dedup": ["x", "y"]}
    for k in (2, 3):
        b.step(_batch(k))
    for (name, pa), pb in zip(
        a.policy.state_dict().items(), b.policy.state_dict().values(), strict=True
    ):
        assert torch.equal(pa, pb), name
    rng = (torch.rand(3), random.random(), np.random.random())
    assert torch.equal(rng[0], expect_rng[0]) and rng[1:] == expect_rng[1:]


def test_checkpoints_are_atomic_pruned_and_verified(tmp_path: Path) -> None:
    t = _trainer(0)
    mgr = CheckpointManager(tmp_path, keep=2)
    paths = [mgr.save(CheckpointState(version=v, step=v), t.policy, t.optimizer) for v in range(3)]  # type: ignore[arg-type]
    assert mgr.list() == paths[1:]
    (tmp_path / ".tmp-ckpt-crashed").mkdir()  # a save killed half-way: invisible
    (paths[2] / "state.msgpack").write_bytes(b"corrupt")  # newest fails its manifest
    loaded = mgr.load_latest(t.policy, t.optimizer)  # type: ignore[arg-type]
    assert loaded is not None and loaded[0] == paths[1] and loaded[1].version == 1
    assert not CheckpointManager.is_flushed(paths[1])
    CheckpointManager.mark_flushed(paths[1])
    assert CheckpointManager.is_flushed(paths[1])
    mgr.save(CheckpointState(version=3, step=3), t.policy, t.optimizer)  # type: ignore[arg-type]
    assert not (tmp_path / ".tmp-ckpt-crashed").exists()


def test_trainer_step_reports_stats_and_minibatches() -> None:
    t = Trainer(
        TinyPolicy(CFG),
        train_config(LearnerSettings(lr=1e-2, minibatches=2, micro_batch_tokens=16)),
    )
    before = [p.detach().clone() for p in t.policy.parameters()]  # type: ignore[attr-defined]
    res = t.step(_batch(0))
    assert res.steps == 2 and t.steps == 2 and res.tokens == 6 * 8
    assert res.stats["samples"] == 6 and res.stats["tokens"] == 30
    for key in ("loss", "ratio_mean", "is_weight_mean", "clip_frac", "grad_norm", "entropy"):
        assert np.isfinite(res.stats[key]), key
    after = list(t.policy.parameters())  # type: ignore[attr-defined]
    assert any(not torch.equal(x, y) for x, y in zip(before, after, strict=True))
