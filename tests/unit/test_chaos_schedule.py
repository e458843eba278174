"""The schedule of `rollstream chaos` (services/chaos.py) on a fake stack: every component
is struck at least MIN_ROUNDS times even when the minutes are short, a component is not
struck twice in a row, and each strike's recovery is measured."""

from __future__ import annotations

import asyncio
import itertools
import signal
from typing import Any

import pytest

from schemas import topics
from services import chaos


class FakeStack:
    def __init__(self) -> None:
        self.n = 0
        self.log: list[str] = []

    def say(self, text: str) -> None:
        self.log.append(text)

    async def ends(self, specs: list[topics.TopicSpec]) -> dict[topics.TopicSpec, dict[int, int]]:
        self.n += 1
        return {spec: {0: self.n} for spec in specs}

    async def arrived(self, spec: topics.TopicSpec, base: dict[int, int], timeout_s: float) -> bool:
        return True  # a committed record past the base at the first look: recovered

    async def kill(self, name: str) -> None:
        self.log.append(f"kill {name}")

    async def restart(self, name: str) -> None:
        self.log.append(f"restart {name}")

    def signal(self, name: str, sig: signal.Signals) -> None:
        self.log.append(f"{sig.name} {name}")


async def test_short_run_still_strikes_every_component_three_times(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real_sleep = asyncio.sleep

    async def fast(seconds: float) -> None:
        await real_sleep(seconds / 1000)

    monkeypatch.setattr(asyncio, "sleep", fast)
    stack = FakeStack()
    report = chaos.ChaosReport(minutes=0.0)
    fake: Any = stack
    await chaos._rounds(fake, report, seconds=0.0)

    for name in chaos.COMPONENTS:
        assert report.strikes.count(name) == chaos.MIN_ROUNDS, report.strikes
        assert len(report.recoveries[name]) == chaos.MIN_ROUNDS
    assert report.strikes.count("sandbox-worker (paused)") == chaos.MIN_ROUNDS
    kills = [s for s in report.strikes if not s.endswith("(paused)")]
    assert all(a != b for a, b in itertools.pairwise(kills)), kills
    assert not report.not_recovered
