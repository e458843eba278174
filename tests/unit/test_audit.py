"""Audit accounting (pure): every published trajectory trained once or dropped with a
reason, in flight only while legitimately pending, and the rest named."""

from __future__ import annotations

from schemas.learning import LedgerEntry, LedgerStatus
from services.audit import Observed, Seen, account, reason_class

NOW = 10_000_000
GRACE_S = 100.0


def entry(tid: str, status: LedgerStatus = LedgerStatus.TRAINED, reason: str = "") -> LedgerEntry:
    return LedgerEntry(trajectory_id=tid, status=status, reason=reason)


def complete_run(n: int = 6) -> Observed:
    """n trajectories published, scored, and settled long ago; the learner is past them."""
    obs = Observed(learner_committed={0: n})
    for i in range(n):
        obs.published[f"t{i}"] = Seen(0, i, NOW - 1_000_000)
        obs.scored[f"t{i}"] = Seen(0, i, NOW - 900_000)
    fates = [
        entry("t0"),
        entry("t1"),
        entry("t2", LedgerStatus.DROPPED, "stale: lag 9 > max_lag 4"),
        entry("t3", LedgerStatus.DROPPED, "too long: 900 tokens > max_seq_len 512"),
        entry("t4", LedgerStatus.MASKED, "sandbox_error: no result after 3 attempts"),
        entry("t5"),
    ]
    obs.ledger = {e.id: e for e in fates[:n]}
    return obs


def test_complete_run_is_ok() -> None:
    rep = account(complete_run(), NOW, GRACE_S)
    assert rep.ok and rep.unaccounted == 0 and rep.in_flight == 0
    assert (rep.published, rep.scored, rep.trained) == (6, 6, 3)
    assert rep.dropped == {"stale": 1, "too long": 1}
    assert rep.masked == {"sandbox_error": 1}


def test_a_removed_ledger_entry_is_named() -> None:
    obs = complete_run()
    gone = next(k for k, e in obs.ledger.items() if e.trajectory_id == "t1")
    del obs.ledger[gone]
    rep = account(obs, NOW, GRACE_S)
    assert not rep.ok and rep.unaccounted == 1 and rep.unaccounted_ids == ["t1"]
    assert rep.to_json()["unaccounted_ids"] == ["t1"]


def test_resent_ledger_entries_count_once_but_two_fates_conflict() -> None:
    obs = complete_run()
    first = next(iter(obs.ledger.values()))
    obs.ledger[first.id] = first  # a re-send keeps its id: one entry
    rep = account(obs, NOW, GRACE_S)
    assert rep.ok and rep.trained == 3
    second = entry(first.trajectory_id)  # a second training of the same trajectory
    obs.ledger[second.id] = second
    rep = account(obs, NOW, GRACE_S)
    assert not rep.ok and list(rep.conflicts) == [first.trajectory_id]


def test_in_flight_until_the_learner_commits_past_the_reward() -> None:
    obs = complete_run()
    obs.published["new"] = Seen(0, 6, NOW - 1_000_000)
    obs.scored["new"] = Seen(0, 6, NOW - 1_000_000)
    rep = account(obs, NOW, GRACE_S)
    assert rep.ok and rep.in_flight == 1  # offset 6 >= committed 6: learner not there yet
    obs.learner_committed = {0: 7}
    rep = account(obs, NOW, GRACE_S)
    assert rep.unaccounted_ids == ["new"]  # the learner moved past it without a fate
    obs.learner_committed = None
    assert account(obs, NOW, GRACE_S).in_flight == 1  # no learner has read anything
    assert account(obs, NOW, GRACE_S, finished=True).unaccounted_ids == ["new"]


def test_unscored_trajectory_is_in_flight_only_within_the_grace() -> None:
    obs = complete_run()
    obs.published["young"] = Seen(1, 0, NOW - 50_000)
    obs.published["old"] = Seen(1, 1, NOW - 500_000)
    rep = account(obs, NOW, GRACE_S)
    assert rep.in_flight == 1 and rep.unaccounted_ids == ["old"]


def test_dispatcher_drops_and_dead_letters_account_for_unscored_trajectories() -> None:
    obs = complete_run()
    obs.published["late"] = Seen(1, 0, NOW - 500_000)
    late = entry("late", LedgerStatus.DROPPED, "late: its group was emitted")
    obs.ledger[late.id] = late
    obs.published["bad"] = Seen(1, 1, NOW - 500_000)
    obs.dead_positions.add((1, 1))
    rep = account(obs, NOW, GRACE_S)
    assert rep.ok and rep.dropped["late"] == 1 and rep.dead_lettered == 1


def test_rewards_published_directly_join_the_universe() -> None:
    obs = complete_run()
    obs.scored["prod"] = Seen(0, 6, NOW - 500_000, origin="production")
    obs.learner_committed = {0: 7}
    prod = entry("prod")
    obs.ledger[prod.id] = prod
    orphan = entry("expired-long-ago")
    obs.ledger[orphan.id] = orphan
    rep = account(obs, NOW, GRACE_S)
    assert rep.ok and rep.published == 7 and rep.direct_to_rewards == 1
    assert rep.published_by_origin == {"live": 6, "production": 1}
    assert rep.ledger_only == 1 and rep.trained == 4


def test_reason_class() -> None:
    assert reason_class("stale: lag 5 > max_lag 4") == "stale"
    assert reason_class("late") == "late"
    assert reason_class("") == "unspecified"
