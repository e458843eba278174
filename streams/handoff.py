"""The fetcher's hand-off of each fetched record to the agent queue, without four tasks per
record (faust-streaming 0.15.3; installed by streams/app.py).

faust's fetcher loop (`Consumer._drain_messages`) hands every record over with
`await self.wait_first(callback(message), self.suspend_flow.wait())`: mode's `wait_first`
wraps both in tasks, adds two more for the consumer's stopped and crashed events, waits
for the first to finish and cancels the other three. That is about a tenth of the
dispatcher's CPU at full load, and the callback (the conductor's `on_message`: decode,
then `put_nowait` into the agent's queue) nearly always finishes without suspending.

`fast_handoff` runs the callback's first step in place. When it finishes there, nothing
else could have happened in between (no other task ran), exactly what `wait_first` would
have seen had the callback won; the unstarted `suspend_flow.wait()` is closed. When the
callback suspends (its queue is full, or the flow is being acquired), the rest of it runs
under the original `wait_first`, so a rebalance that suspends the flow still abandons it
as before. The fast path is never taken while the flow is suspended, nor for any other
caller of `wait_first`.
"""

from __future__ import annotations

from collections.abc import Coroutine, Generator
from typing import Any

MARK = "_rollstream_fast_handoff"


class Resumed:
    """The rest of a coroutine that already ran its first step and yielded `step`: awaiting
    this hands `step` to the awaiting task and drives the coroutine on from there
    (results, exceptions and cancellation pass through unchanged)."""

    def __init__(self, coro: Coroutine[Any, Any, Any], step: Any) -> None:
        self.coro, self.step = coro, step

    def __await__(self) -> Generator[Any, Any, Any]:
        coro, step = self.coro, self.step
        while True:
            try:
                sent = yield step
            except GeneratorExit:
                coro.close()
                raise
            except BaseException as exc:  # cancellation, thrown into the coroutine
                try:
                    step = coro.throw(exc)
                except StopIteration as done:
                    return done.value
                continue
            try:
                step = coro.send(sent)
            except StopIteration as done:
                return done.value


def first_step(coro: Coroutine[Any, Any, Any]) -> tuple[bool, Any]:
    """Run `coro` until it first suspends: (True, its result) when it finished, else
    (False, what it yielded). Its exceptions propagate."""
    try:
        step = coro.send(None)
    except StopIteration as done:
        return True, done.value
    return False, step


def fast_handoff(consumer: Any) -> None:
    """Give faust's `consumer` the fast path of the module docstring (once)."""
    if getattr(consumer, MARK, False):
        return
    from mode.services import WaitResults

    slow = consumer.wait_first
    handler = getattr(consumer.callback, "__code__", None)

    async def wait_first(*coros: Any, timeout: Any = None) -> Any:  # noqa: ASYNC109 (mode's signature)
        first: Any = coros[0] if coros else None
        if (
            handler is None
            or timeout is not None
            or len(coros) != 2
            or getattr(first, "cr_code", None) is not handler
            or consumer.suspend_flow.is_set()
        ):
            return await slow(*coros, timeout=timeout)
        try:
            finished, value = first_step(first)
        except BaseException:
            coros[1].close()
            raise
        if finished:
            coros[1].close()  # suspend_flow.wait(), never started
            return WaitResults([first], [value], False)
        return await slow(Resumed(first, value), coros[1])

    consumer.wait_first = wait_first
    setattr(consumer, MARK, True)
