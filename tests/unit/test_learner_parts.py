"""Pure parts of the learner: batching, staleness, samples and their collation."""

from __future__ import annotations

import random

import numpy as np
import torch

from learner import staleness
from learner.batching import (
    TokenBudgetBatcher,
    cheapest_cuts,
    micro_batches,
    prefix_micro_batches,
    split_even,
)
from learner.sample import Sample, collate, problem

torch.set_num_threads(1)


def _sample(p: int, c: int, **kw: object) -> Sample:
    return Sample(
        trajectory_id=f"t{p}-{c}",
        group_id="g",
        prompt=np.arange(1, p + 1, dtype=np.int32),
        completion=np.arange(10, 10 + c, dtype=np.int32),
        advantage=1.0,
        **kw,  # type: ignore[arg-type]
    )


def test_batcher_emits_at_the_token_budget() -> None:
    b: TokenBudgetBatcher[int] = TokenBudgetBatcher(10, length=lambda n: n)
    assert b.add(4) is None and b.add(5) is None and b.tokens == 9
    assert b.add(3) == [4, 5, 3]  # overshoots by less than its last item
    assert len(b) == 0 and b.add(12) == [12]  # one long item is a batch of its own
    b.add(1)
    assert b.flush() == [1] and b.flush() == []


def test_batcher_item_cap() -> None:
    b: TokenBudgetBatcher[int] = TokenBudgetBatcher(1000, length=lambda n: n, max_items=2)
    assert b.add(1) is None and b.add(1) == [1, 1]


def test_micro_batches_fit_the_padded_budget() -> None:
    lengths = [5, 30, 7, 8, 29, 6, 100]
    groups = micro_batches(lengths, budget=64)
    assert sorted(i for g in groups for i in g) == list(range(len(lengths)))
    for g in groups:
        assert len(g) == 1 or max(lengths[i] for i in g) * len(g) <= 64
    assert [6] in groups  # longer than the budget: alone
    assert {1, 4} <= set(next(g for g in groups if 1 in g))  # similar lengths share


def test_prefix_micro_batches_hold_one_prompt_each_within_the_budget() -> None:
    lengths = [30, 12, 25, 28, 14, 90, 13, 29]
    keys = [b"a", b"b", b"a", b"a", b"b", b"c", b"b", b"a"]
    prefix = [20, 10, 20, 20, 10, 80, 10, 20]
    groups = prefix_micro_batches(lengths, keys, prefix, budget=60)
    assert sorted(i for g in groups for i in g) == list(range(len(lengths)))
    for g in groups:
        assert len({keys[i] for i in g}) == 1  # one prompt per micro-batch
        p, longest = prefix[g[0]], max(lengths[i] for i in g)
        assert len(g) == 1 or p + len(g) * (longest - p) <= 60
    assert [5] in groups  # over the budget: alone
    assert sorted(next(g for g in groups if 1 in g)) == [1, 4, 6]  # 10 + 3 x 4 <= 60
    # a: 20 + 4 x 10 = 60 fits one pass, where padding every row would take 4 x 30 = 120
    assert sorted(next(g for g in groups if 0 in g)) == [0, 2, 3, 7]


def test_prefix_micro_batches_cut_a_group_whose_lengths_vary() -> None:
    """Two long completions and six short ones: the prompt runs twice, nobody pads to 140."""
    tails = [140, 130, 40, 30, 20, 20, 10, 5]
    assert cheapest_cuts(tails, 137, 2000) == [2, 8]
    lengths = [137 + t for t in tails]
    groups = prefix_micro_batches(lengths, [b"g"] * 8, [137] * 8, budget=2000)
    assert groups == [[0, 1], [2, 3, 4, 5, 6, 7]]
    # equal lengths: one pass (a second prompt would only add cost)
    assert cheapest_cuts([50] * 8, 137, 2000) == [8]


def _brute_force(tails: list[int], prefix: int, budget: int) -> int:
    n, best = len(tails), None
    for mask in range(1 << (n - 1)):
        ends = [i + 1 for i in range(n - 1) if mask >> i & 1] + [n]
        cost, start = 0, 0
        for end in ends:
            run = prefix + (end - start) * tails[start]
            if run > budget and end - start > 1:
                break
            cost, start = cost + run, end
        else:
            best = cost if best is None else min(best, cost)
    assert best is not None
    return best


def test_cheapest_cuts_match_brute_force() -> None:
    rng = random.Random(7)
    for _ in range(300):
        n = rng.randint(1, 8)
        tails = sorted((rng.randint(0, 200) for _ in range(n)), reverse=True)
        prefix, budget = rng.randint(0, 150), rng.randint(50, 1200)
        ends = cheapest_cuts(tails, prefix, budget)
        assert ends[-1] == n and ends == sorted(set(ends))
        cost, start = 0, 0
        for end in ends:
            run = prefix + (end - start) * tails[start]
            assert end - start == 1 or run <= budget
            cost, start = cost + run, end
        assert cost == _brute_force(tails, prefix, budget)


def test_split_even() -> None:
    assert split_even([1, 2, 3, 4, 5], 2) == [[1, 2, 3], [4, 5]]
    assert split_even([1], 4) == [[1]]


def test_staleness() -> None:
    assert staleness.oldest_version([5, 3, -1, 4], 9) == 3
    assert staleness.oldest_version([], 7) == 7
    assert staleness.oldest_version([-1], -1) == -1
    assert staleness.lag(10, 6) == 4 and staleness.lag(3, 5) == 0 and staleness.lag(3, -1) is None
    assert staleness.stale_reason(4, 4) is None and staleness.stale_reason(None, 0) is None
    assert staleness.stale_reason(5, 4) == "stale: lag 5 > max_lag 4"
    hist = staleness.histogram([0, 1, 1, 7, None], 2)
    assert hist == {"0": 1, "1": 2, "2": 0, ">2": 1, "unknown": 1}


def test_sample_version_and_problems() -> None:
    s = _sample(2, 3, token_versions=np.array([4, 3, -1], np.int32), policy_version=4)
    assert s.version == 3 and s.length == 5 and s.trained_tokens == 3
    assert problem(s, vocab_size=259, max_seq_len=5) is None
    assert "too long" in str(problem(s, vocab_size=259, max_seq_len=4))
    assert "vocabulary" in str(problem(s, vocab_size=12, max_seq_len=99))
    assert "empty prompt" in str(problem(_sample(0, 2), 259, 99))
    masked = _sample(1, 2, train_mask=np.zeros(2, bool))
    assert "no trainable" in str(problem(masked, 259, 99))
    nan = _sample(1, 2, behaviour_logp=np.array([np.nan, 0], np.float32))
    assert "non-finite" in str(problem(nan, 259, 99))


def test_collate_aligns_completion_tokens_with_their_logits() -> None:
    a = _sample(2, 3, behaviour_logp=np.array([-1, -2, -3], np.float32))
    b = _sample(3, 1, train_mask=np.array([False]))
    batch = collate([a, b], pad_id=0, device="cpu")
    assert batch.tokens.tolist() == [[1, 2, 10, 11, 12], [1, 2, 3, 10, 0]]
    assert batch.attention_mask.tolist() == [[1, 1, 1, 1, 1], [1, 1, 1, 1, 0]]
    # target index j predicts tokens[:, j + 1]
    assert batch.loss_mask.tolist() == [[0, 1, 1, 1], [0, 0, 0, 0]]
    assert batch.behaviour_logp.tolist() == [[0, -1, -2, -3], [0, 0, 0, 0]]
    assert batch.has_behaviour.tolist() == [True, False]


def test_from_scored_reads_the_packed_arrays() -> None:
    from learner.sample import from_scored
    from schemas.arrays import pack_f32, pack_i32
    from schemas.messages import Outcome, ScoredTrajectory, Trajectory, VerifierSpec

    traj = Trajectory(
        task_id="t",
        group_id="g",
        group_size=2,
        prompt_tokens=pack_i32([256, 65]),
        completion_tokens=pack_i32([66, 257]),
        behaviour_logprobs=pack_f32([-0.5, -0.25]),
        policy_versions=pack_i32([3, 4]),
        policy_version=3,
        verifier=VerifierSpec(name="exact", answer="B", needs_sandbox=False),
    )
    msg = ScoredTrajectory(trajectory=traj, reward=1.0, advantage=0.5, outcome=Outcome.PASSED)
    s = from_scored(msg)
    assert s.trajectory_id == traj.id and s.group_id == "g" and s.version == 3
    assert s.prompt.tolist() == [256, 65] and s.completion.tolist() == [66, 257]
    assert s.behaviour_logp is not None and s.behaviour_logp.tolist() == [-0.5, -0.25]
    assert (s.advantage, s.reward) == (0.5, 1.0)
