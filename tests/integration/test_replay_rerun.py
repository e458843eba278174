"""Replay is resumable and idempotent: ids come from (source id, replay tag), so a rerun
of a finished replay publishes nothing and an interrupted one publishes only the rest."""

from __future__ import annotations

import pytest

from schemas import topics
from schemas.rollout import Trajectory
from services import kafka_read, replay_plan
from services import replay as rp
from services import topics as topic_admin
from services.settings import Settings

from .dispatch_helpers import produce, with_prefix
from .ops_helpers import read_all, records
from .test_replay import batch


class Interrupted(Exception):
    pass


async def test_replay_rerun_publishes_nothing_new(
    settings: Settings, prefix: str, monkeypatch: pytest.MonkeyPatch, _stack_up: None
) -> None:
    run = with_prefix(settings, prefix)
    await topic_admin.ensure(run)
    originals = batch("r", 3)
    await produce(run, records(run, topics.TRAJECTORIES, list(originals)))
    source = rp.TopicSource(prefix, "trajectories", kafka_read.Selection())

    # the first run dies after 5 records: the rerun publishes only the other 7
    sent = 0
    send = rp._Sink.send

    async def dying(self: rp._Sink, key: str, msg: object) -> None:
        nonlocal sent
        if sent == 5:
            await self.flush()
            raise Interrupted
        sent += 1
        await send(self, key, msg)  # type: ignore[arg-type]

    monkeypatch.setattr(rp._Sink, "send", dying)
    with pytest.raises(Interrupted):
        await rp.replay(run, source)
    monkeypatch.setattr(rp._Sink, "send", send)
    resumed = await rp.replay(run, source)
    assert (resumed.published, resumed.already_published) == (7, 5), resumed.to_json()

    again = await rp.replay(run, source)
    assert again.published == 0 and again.already_published == len(originals)
    assert sum(again.skipped.values()) == len(originals)  # its own output, not re-replayed

    found = await read_all(run, topics.TRAJECTORIES, Trajectory)
    copies = [t for t in found if t.parent_id]
    assert len(copies) == len({t.id for t in copies}) == len(originals)
    tag = resumed.tag
    assert {t.id for t in copies} == {replay_plan.replayed_id(t.id, tag) for t in originals}

    other = await rp.replay(run, source, tag="another")  # a new tag replays on purpose:
    assert other.published == 2 * len(originals)  # the originals and the first tag's copies
