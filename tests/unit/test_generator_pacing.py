"""Property test of pacing (services/rollout/pacing.py): whatever the learner does, a
generator asking before each group never has more than (max_lag + 1) x batch
trajectories outstanding; with a group larger than the window, never more than a group."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from services.rollout import pacing

# one step of the world: the generator asks (True) or the learner settles n samples
EVENTS = st.lists(st.one_of(st.just(-1), st.integers(0, 64)), min_size=1, max_size=300)


def _run(max_lag: int, batch: int, group: int, events: list[int], others: int) -> list[int]:
    """Outstanding after every event of one generator (others' counts fixed, settled)."""
    win = pacing.window(max_lag, batch)
    own = in_flight = 0
    consumed = others
    seen = []
    for ev in events:
        if ev < 0:  # the generator finishes its in-flight group, then asks for the next one
            own, in_flight = own + in_flight, 0
            now = pacing.outstanding(own, in_flight, others, consumed)
            if pacing.may_start(group, now, win):
                in_flight = group
        else:  # the learner settles up to `ev` of what was produced
            consumed = min(own + others, consumed + ev)
        seen.append(pacing.outstanding(own, in_flight, others, consumed))
    return seen


@settings(max_examples=300, deadline=None)
@given(
    max_lag=st.integers(0, 8),
    batch=st.integers(1, 64),
    group=st.integers(1, 32),
    events=EVENTS,
    others=st.integers(0, 1000),
)
def test_outstanding_never_exceeds_the_window(
    max_lag: int, batch: int, group: int, events: list[int], others: int
) -> None:
    win = pacing.window(max_lag, batch)
    bound = max(win, group)  # a group larger than the window starts only when caught up
    seen = _run(max_lag, batch, group, events, others)
    assert all(0 <= n <= bound for n in seen)
    if group <= win:
        assert max(seen) <= (max_lag + 1) * batch


@settings(max_examples=100, deadline=None)
@given(max_lag=st.integers(0, 8), batch=st.integers(1, 64), group=st.integers(1, 32))
def test_a_caught_up_learner_always_admits_a_group(max_lag: int, batch: int, group: int) -> None:
    """No deadlock: with nothing outstanding a group may always start."""
    win = pacing.window(max_lag, batch)
    assert pacing.may_start(group, pacing.outstanding(50, 0, 10, 60), win)


def test_the_board_keeps_the_learners_count_and_each_generators_highest() -> None:
    from schemas.learning import Progress
    from services.rollout.progress import ProgressBoard
    from services.settings import load

    s = load([])
    board = ProgressBoard(s, "me", dead_letters=None)  # type: ignore[arg-type]
    pol = s.learner.policy
    board._take(Progress(source=f"learner/{pol}", policy=pol, samples_consumed=40))
    board._take(Progress(source=f"learner/{pol}", policy=pol, samples_consumed=30))  # older
    board._take(Progress(source="generator/a", policy=pol, produced=24))
    board._take(Progress(source="generator/a", policy=pol, produced=16))  # reordered
    board._take(Progress(source="generator/me", policy=pol, produced=99))  # own: exact locally
    board._take(Progress(source="generator/b", policy="other", produced=500))  # other policy
    assert board.consumed == 40 and board.others_produced() == 24


def test_the_learner_announces_its_settled_count_when_it_moves() -> None:
    import asyncio
    from dataclasses import dataclass

    from learner.progress import announce
    from schemas import codec
    from schemas.learning import Progress

    @dataclass
    class Counts:
        generated_consumed: int = 0
        version: int = 0

    class Sender:
        def __init__(self) -> None:
            self.sent: list[Progress] = []

        async def send_and_wait(
            self, topic: str, value: bytes | None = None, key: bytes | None = None
        ) -> object:
            assert value is not None and key == b"learner/p"
            self.sent.append(codec.decode(value, Progress))
            return None

    async def scenario() -> list[Progress]:
        counts, io, stop = Counts(), Sender(), asyncio.Event()
        task = asyncio.create_task(announce(counts, io, "t", "p", 0.01, stop))
        await asyncio.sleep(0.05)  # unchanged: announced once
        counts.generated_consumed = 12  # settled without a step: no new version
        await asyncio.sleep(0.05)
        stop.set()
        await task
        return io.sent

    sent = asyncio.run(scenario())
    assert [m.samples_consumed for m in sent] == [0, 12]
    assert all(m.version == 0 and m.policy == "p" for m in sent)
