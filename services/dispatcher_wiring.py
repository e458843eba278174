"""The reward dispatcher's composition (`rollstream dispatcher`): streams.ports.Wiring from
the settings (broker, topic prefix and partitions, state directory, the run's claim check,
a tick producer on services/kafka.py), then the faust app of streams/app.py."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from services import kafka

if TYPE_CHECKING:
    import faust

    from services.settings import Settings
    from streams.dispatcher import Dispatcher
    from streams.ports import Wiring


class KafkaTicks:
    """streams.ports.Ticks on services/kafka.py's producer (started on first use: the
    dispatcher's timer runs inside faust's event loop)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.producer: Any = None

    async def send(self, topic: str, keys: list[bytes]) -> None:
        if self.producer is None:
            self.producer = kafka.producer(self.settings, "rollstream-dispatcher-ticks")
            await self.producer.start()
        for key in keys:
            await self.producer.send(topic, b"", key=key)
        await self.producer.flush()

    async def close(self) -> None:
        if self.producer is not None:
            await self.producer.stop()


def wiring(settings: Settings) -> Wiring:
    """Where the dispatcher of the run (settings topics.prefix) connects."""
    from services import blobs
    from streams.ports import Wiring

    return Wiring(
        brokers=settings.kafka.endpoint.split(","),
        prefix=settings.topics.prefix,
        partitions=settings.topics.partitions,
        state_dir=settings.stack.state_dir,
        claim_check=blobs.from_settings(settings),
        ticks=KafkaTicks(settings),
        replication=settings.dispatcher.changelog_replication or 1,
    )


def build(settings: Settings) -> tuple[faust.App, Dispatcher]:
    """The dispatcher's faust app with its agents, table and timer."""
    from streams.app import build_app

    return build_app(wiring(settings), settings.dispatcher, settings.rewards)


def run(settings: Settings) -> None:
    """Run the dispatcher as a faust worker until SIGTERM/SIGINT."""
    from streams import service

    app, _ = build(settings)
    service.run(app, settings.dispatcher)
