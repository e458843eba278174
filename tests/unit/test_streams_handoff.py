"""streams/handoff.py on mode's real Service.wait_first: the fetcher's hand-off finishes in
place when the callback does not suspend, and otherwise behaves as faust's own (the flow's
suspension still abandons a callback that waits)."""

from __future__ import annotations

import asyncio
import warnings
from typing import Any

import pytest
from mode import Service

from streams.handoff import MARK, Resumed, fast_handoff


class Consumer(Service):
    """What the fetcher loop uses of faust's consumer."""

    def __init__(self) -> None:
        super().__init__()
        self.suspend_flow = asyncio.Event()
        self.gate = asyncio.Event()
        self.handled: list[int] = []
        self.callback = self.on_message

    async def on_message(self, message: int) -> int:
        if message < 0:
            raise ValueError("undecodable")
        if message >= 100:  # a full queue: waits for room
            await self.gate.wait()
        self.handled.append(message)
        return message * 2


async def hand_off(c: Consumer, message: int) -> Any:
    """What faust's Consumer._drain_messages does with each record."""
    return await c.wait_first(c.callback(message), c.suspend_flow.wait())


async def test_a_callback_that_does_not_suspend_finishes_in_place() -> None:
    c = Consumer()
    fast_handoff(c)
    before = len(asyncio.all_tasks())
    started = hand_off(c, 3)
    with pytest.raises(StopIteration) as done:  # done at its very first step: no task
        started.send(None)
    assert done.value.value.results == [6]
    assert c.handled == [3]
    assert len(asyncio.all_tasks()) == before


async def test_a_callback_that_waits_is_finished_by_the_original() -> None:
    c = Consumer()
    fast_handoff(c)
    waiting = asyncio.ensure_future(hand_off(c, 100))
    await asyncio.sleep(0.01)
    assert not waiting.done()
    c.gate.set()
    got = await asyncio.wait_for(waiting, 1)
    assert got.results == [200] and c.handled == [100]


async def test_a_suspended_flow_abandons_a_waiting_callback_as_before() -> None:
    c = Consumer()
    fast_handoff(c)
    waiting = asyncio.ensure_future(hand_off(c, 100))
    await asyncio.sleep(0.01)
    c.suspend_flow.set()  # a rebalance
    got = await asyncio.wait_for(waiting, 1)
    assert got.results == [True]  # the flow's wait won; the callback was cancelled
    c.gate.set()
    await asyncio.sleep(0.01)
    assert c.handled == []


async def test_while_the_flow_is_suspended_the_original_runs() -> None:
    c = Consumer()
    fast_handoff(c)
    c.suspend_flow.set()
    started = hand_off(c, 3)
    assert started.send(None) is not None  # suspends: the original wait_first's tasks
    started.close()


async def test_a_failing_callback_raises_and_leaves_no_unawaited_coroutine() -> None:
    c = Consumer()
    fast_handoff(c)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(ValueError, match="undecodable"):
            await hand_off(c, -1)


async def test_other_callers_and_timeouts_take_the_original() -> None:
    c = Consumer()
    fast_handoff(c)
    fast_handoff(c)  # once only
    assert getattr(c, MARK)
    other = asyncio.Event()
    other.set()
    got = await c.wait_first(other.wait(), c.suspend_flow.wait(), timeout=1.0)
    assert got.results == [True]


async def test_resumed_passes_cancellation_into_the_coroutine() -> None:
    seen: list[str] = []

    async def body() -> None:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            seen.append("cancelled")
            raise

    coro = body()
    step = coro.send(None)
    task = asyncio.ensure_future(Resumed(coro, step))
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert seen == ["cancelled"]
