"""CLI of the edges and the operator's tools: `rollstream replay`, `export`, `ingest`,
`audit` and `status`; registered on the root app by services/cli.py. Every heavy import
(aiokafka, fastapi, uvicorn, torch, docker) happens inside a command."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

if TYPE_CHECKING:
    from services.kafka_read import Selection
    from services.settings import RewardsSettings, Settings

Prefix = Annotated[str | None, typer.Option(help="Topic prefix of the run (topics.prefix).")]
AsJson = Annotated[bool, typer.Option("--json", help="Print the result as JSON.")]
Since = Annotated[
    str | None,
    typer.Option(help="Records at or after this time: ISO 8601, Unix seconds, or ago (15m)."),
]
Until = Annotated[str | None, typer.Option(help="Records before this time (same forms).")]
StartOffset = Annotated[
    int | None, typer.Option(min=0, help="First offset of each partition (inclusive).")
]
EndOffset = Annotated[
    int | None, typer.Option(min=0, help="Offset of each partition to stop before.")
]
Partitions = Annotated[
    list[int] | None, typer.Option("--partition", help="Only this partition (repeatable).")
]


def _settings(ctx: typer.Context, **flags: Any) -> Settings:
    from services.cli_common import settings_from

    return settings_from(ctx, **flags)


def _selection(
    since: str | None,
    until: str | None,
    start_offset: int | None,
    end_offset: int | None,
    partitions: list[int] | None,
) -> Selection:
    from services.kafka_read import Selection
    from services.replay_plan import parse_instant

    try:
        return Selection(
            start_offset=start_offset,
            end_offset=end_offset,
            since_ms=None if since is None else parse_instant(since),
            until_ms=None if until is None else parse_instant(until),
            partitions=tuple(partitions) if partitions else None,
        )
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None


def _fail(message: str) -> typer.Exit:
    typer.echo(f"rollstream: {message}", err=True)
    return typer.Exit(2)


def reward_map(base: RewardsSettings, path: Path | None, pairs: list[str]) -> RewardsSettings:
    """The dispatcher's reward map with a TOML file's `[rewards]` table (or top level)
    and KEY=VALUE pairs on top, validated like the settings section."""
    import tomllib

    from pydantic import ValidationError

    from services.settings import RewardsSettings

    values: dict[str, Any] = base.model_dump()
    if path is not None:
        try:
            doc = tomllib.loads(path.read_text())
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ValueError(f"--reward-map {path}: {exc}") from None
        values.update(doc.get("rewards", doc))
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise ValueError(f"--reward {pair!r}: expected KEY=VALUE (e.g. mode=all_pass)")
        values[key.strip()] = value.strip()
    try:
        return RewardsSettings(**values)
    except ValidationError as exc:
        raise ValueError(f"invalid reward map: {exc}") from None


def _verifier(raw: str | None, name: str | None, version: str | None) -> dict[str, Any]:
    changes: dict[str, Any] = {}
    if raw is not None:
        try:
            changes = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise typer.BadParameter(f"--verifier is not JSON: {exc}") from None
        if not isinstance(changes, dict):
            raise typer.BadParameter('--verifier must be a JSON object, e.g. {"answer": "42"}')
    if name is not None:
        changes["name"] = name
    if version is not None:
        changes["version"] = version
    return changes


def register(app: typer.Typer) -> None:
    """Add `replay`, `export`, `ingest`, `audit` and `status`."""
    _register_replay(app)
    _register_export(app)
    _register_ingest(app)
    _register_audit(app)
    _register_status(app)


ToPrefix = Annotated[str | None, typer.Option(help="Run to publish into (topics.prefix).")]
FromPrefix = Annotated[str | None, typer.Option(help="Run to read from (default: --prefix).")]
SourceTopic = Annotated[str, typer.Option(help="Source topic: trajectories, or rewards.")]
Files = Annotated[
    list[Path] | None, typer.Option("--file", help="Read these JSONL/MessagePack log files.")
]
VerifierJson = Annotated[
    str | None,
    typer.Option(help='Re-score: verifier fields to replace, as JSON ({"answer": "4"}).'),
]
VerifierName = Annotated[str | None, typer.Option(help="Re-score with this verifier.")]
VerifierVersion = Annotated[str | None, typer.Option(help="Re-score with this verifier version.")]
RewardMapFile = Annotated[
    Path | None, typer.Option("--reward-map", help="Re-score rewards under this map (TOML).")
]
RewardPairs = Annotated[
    list[str] | None, typer.Option(help="Reward map change KEY=VALUE (repeatable): passed=2.")
]
Rate = Annotated[float | None, typer.Option(help="Records per second (0: no limit).")]
DryRun = Annotated[bool, typer.Option(help="Only count what would be replayed.")]
Lineage = Annotated[bool, typer.Option(help="List new id -> original id.")]
Tag = Annotated[
    str | None,
    typer.Option(help="Name of this replay (default: from what it does; a rerun resumes)."),
]


def _register_replay(app: typer.Typer) -> None:
    @app.command()
    def replay(
        ctx: typer.Context,
        prefix: ToPrefix = None,
        from_prefix: FromPrefix = None,
        topic: SourceTopic = "trajectories",
        file: Files = None,
        since: Since = None,
        until: Until = None,
        start_offset: StartOffset = None,
        end_offset: EndOffset = None,
        partition: Partitions = None,
        verifier: VerifierJson = None,
        verifier_name: VerifierName = None,
        verifier_version: VerifierVersion = None,
        reward_map_file: RewardMapFile = None,
        reward: RewardPairs = None,
        rate: Rate = None,
        dry_run: DryRun = False,
        lineage: Lineage = False,
        tag: Tag = None,
        as_json: AsJson = False,
    ) -> None:
        """Publish a run's trajectories again, with lineage; optionally re-scored.

        From a topic by offsets or time window, or from log files; origin=replay, parent_id
        = the original's id. Re-scoring: another verifier (the dispatcher scores them
        again), or another reward map (from rewards: the original verdicts re-mapped)."""
        import asyncio

        from services import replay as rp
        from services.logfiles import LogFileError

        settings = _settings(ctx, **{"topics.prefix": prefix, "replay.rate": rate})
        changes = _verifier(verifier, verifier_name, verifier_version)
        try:
            rmap = None
            if reward_map_file is not None or reward:
                rmap = reward_map(settings.rewards, reward_map_file, list(reward or []))
            if topic not in ("trajectories", "rewards"):
                raise ValueError(f"--topic {topic!r}: replay reads trajectories or rewards")
            source: rp.Source
            if file:
                source = rp.FileSource(tuple(file))
            else:
                sel = _selection(since, until, start_offset, end_offset, partition)
                source = rp.TopicSource(from_prefix or settings.topics.prefix, topic, sel)
            job = rp.replay(
                settings, source, verifier=changes, reward_map=rmap, dry_run=dry_run, tag=tag
            )
            report = asyncio.run(job)
        except (ValueError, LogFileError) as exc:
            raise _fail(str(exc)) from None
        _print(report.to_json(with_ids=lineage), as_json)


def _register_export(app: typer.Typer) -> None:
    @app.command()
    def export(
        ctx: typer.Context,
        out: Annotated[
            Path, typer.Argument(help="File to write (.jsonl, .msgpack, .parquet; .gz).")
        ],
        prefix: Prefix = None,
        topic: Annotated[
            str, typer.Option(help="Topic to export (its name in the run).")
        ] = "trajectories",
        fmt: Annotated[
            str | None,
            typer.Option("--format", help="jsonl | msgpack | parquet (default: by name)."),
        ] = None,
        since: Since = None,
        until: Until = None,
        start_offset: StartOffset = None,
        end_offset: EndOffset = None,
        partition: Partitions = None,
        as_json: AsJson = False,
    ) -> None:
        """Write a topic's messages to a file, for archiving beyond Kafka retention."""
        import asyncio

        from services.export import export as run_export

        settings = _settings(ctx, **{"topics.prefix": prefix})
        sel = _selection(since, until, start_offset, end_offset, partition)
        try:
            report = asyncio.run(run_export(settings, topic, out, sel, fmt))
        except ValueError as exc:
            raise _fail(str(exc)) from None
        _print(report.to_json(), as_json)


def _register_ingest(app: typer.Typer) -> None:
    @app.command()
    def ingest(
        ctx: typer.Context,
        prefix: Prefix = None,
        host: Annotated[str | None, typer.Option(help="Listen address (ingest.host).")] = None,
        port: Annotated[int | None, typer.Option(help="Listen port (ingest.port).")] = None,
    ) -> None:
        """Run the ingest gateway for production traces and feedback (HTTP).

        Bearer tokens from ingest.tokens or ingest.tokens_file; OpenAPI docs at /docs."""
        from services.ingest.server import serve

        settings = _settings(
            ctx, **{"topics.prefix": prefix, "ingest.host": host, "ingest.port": port}
        )
        try:
            serve(settings)
        except ValueError as exc:
            raise _fail(str(exc)) from None


def _register_audit(app: typer.Typer) -> None:
    @app.command()
    def audit(
        ctx: typer.Context,
        prefix: Prefix = None,
        grace: Annotated[
            float | None,
            typer.Option(
                help="Seconds an unscored trajectory may be pending (default: the "
                "dispatcher's deadlines + 60)."
            ),
        ] = None,
        finished: Annotated[
            bool, typer.Option(help="The run is over: nothing is in flight.")
        ] = False,
        as_json: AsJson = False,
    ) -> None:
        """Account for every published trajectory of a run; exit 1 if any is lost.

        Trained, dropped (by reason), masked, in flight, or unaccounted. Exit 1 when any is
        unaccounted or has conflicting fates."""
        import asyncio

        from services.audit import audit as run_audit

        settings = _settings(ctx, **{"topics.prefix": prefix})
        report = asyncio.run(run_audit(settings, grace_s=grace, finished=finished))
        data = report.to_json()
        if as_json:
            typer.echo(json.dumps(data, indent=2))
        else:
            _print_audit(data)
        raise typer.Exit(0 if report.ok else 1)


def _print_audit(data: dict[str, Any]) -> None:
    verdict = "OK" if data["ok"] else "FAILED"
    typer.echo(f"audit of {data['prefix']}: {verdict}")
    for key in ("published", "direct_to_rewards", "scored", "scored_masked", "trained"):
        typer.echo(f"  {key.replace('_', ' '):<18} {data[key]}")
    for key in ("dropped", "masked", "published_by_origin", "undecodable"):
        for reason, n in sorted(data[key].items()):
            typer.echo(f"  {key.replace('_', ' ')}: {reason:<14} {n}")
    for key in ("dead_lettered", "in_flight", "ledger_only", "dlq", "unaccounted"):
        typer.echo(f"  {key.replace('_', ' '):<18} {data[key]}")
    for tid in data["unaccounted_ids"]:
        typer.echo(f"  unaccounted: {tid}")
    for tid, fates in data["conflicts"].items():
        typer.echo(f"  conflicting fates of {tid}: {'; '.join(fates)}")


def _register_status(app: typer.Typer) -> None:
    @app.command()
    def status(
        ctx: typer.Context,
        prefix: Prefix = None,
        once: Annotated[bool, typer.Option(help="Print once instead of refreshing.")] = False,
        interval: Annotated[float, typer.Option(min=0.2, help="Seconds between refreshes.")] = 2.0,
        count: Annotated[
            int | None, typer.Option(min=1, help="Stop after this many refreshes.")
        ] = None,
        window: Annotated[float, typer.Option(min=1.0, help="Throughput window, seconds.")] = 60.0,
        as_json: AsJson = False,
    ) -> None:
        """Show a run's lag, throughput, learner, staleness, rewards and DLQ, live.

        Lag per consumer group, throughput per topic, learner version and step, staleness,
        reward trend, sandbox pool, traces awaiting feedback, DLQ count; Ctrl-C stops."""
        import asyncio

        from services import status_view
        from services.status import snapshot

        settings = _settings(ctx, **{"topics.prefix": prefix})
        try:
            if as_json or once:
                _status_once(asyncio.run(snapshot(settings, window)), as_json)
            else:
                status_view.live(settings, interval, count, window)
        except Exception as exc:  # an operator command reports, it never dies with a trace
            typer.echo(f"status: cannot read run {settings.topics.prefix}: {exc!r}", err=True)
            raise typer.Exit(1) from None


def _status_once(snap: Any, as_json: bool) -> None:
    from services import status_view

    if as_json:
        typer.echo(json.dumps(snap.to_json(), indent=2))
    else:
        from rich.console import Console

        Console().print(status_view.render(snap))


def _print(data: dict[str, Any], as_json: bool) -> None:
    if as_json:
        typer.echo(json.dumps(data, indent=2))
        return
    for key, value in data.items():
        typer.echo(f"{key}: {value}")
