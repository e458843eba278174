"""CLI commands of the sandbox area; registered on the root app by services/cli.py.
Heavy imports stay inside the command functions (`rollstream --help` must stay instant)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

if TYPE_CHECKING:
    from schemas.sandbox import IOCase, SandboxRequest

sandbox_app = typer.Typer(help="Run and verify code in the sandbox tier.", no_args_is_help=True)

_FILE = {"exists": True, "dir_okay": False, "readable": True}


def _cases(path: Path) -> list[IOCase]:
    """A JSON list of {"stdin": ..., "stdout": ...}, or one such object per line."""
    import msgspec

    from schemas.sandbox import IOCase

    text = path.read_text()
    try:
        data = json.loads(text)
    except ValueError:
        data = [json.loads(line) for line in text.splitlines() if line.strip()]
    try:
        return msgspec.convert(data if isinstance(data, list) else [data], list[IOCase])
    except msgspec.ValidationError as exc:
        raise typer.BadParameter(f"{path}: {exc}", param_hint="--cases") from exc


def _request(
    code: Path, tests: Path | None, cases: Path | None, verifier: str | None, **kw: Any
) -> SandboxRequest:
    from schemas.envelope import new_id
    from schemas.sandbox import SandboxRequest, VerifierSpec

    if tests is not None and cases is not None:
        raise typer.BadParameter("give --tests or --cases, not both")
    name = verifier or ("stdin_stdout" if cases is not None else "python_tests")
    spec = VerifierSpec(
        name=name,
        tests=tests.read_text() if tests is not None else None,
        cases=_cases(cases) if cases is not None else [],
        answer=kw.pop("answer"),
        pattern=kw.pop("pattern"),
        needs_sandbox=name in ("python_tests", "stdin_stdout"),
    )
    rid = new_id()
    return SandboxRequest(
        request_id=rid, trajectory_id=f"cli-{rid}", group_id=f"cli-{rid}", task_id="cli",
        code=code.read_text(), verifier=spec, **kw,
    )  # fmt: skip


def _print(result: Any, reward: float | None, as_json: bool) -> None:
    import msgspec

    if as_json:
        data = msgspec.to_builtins(result)
        data["reward"] = reward
        typer.echo(json.dumps(data, indent=2))
        return
    shown = "masked" if reward is None else f"{reward:g}"
    typer.echo(f"outcome:   {result.outcome.value}")
    typer.echo(f"passed:    {result.passed}/{result.total}")
    typer.echo(f"reward:    {shown}")
    typer.echo(f"duration:  {result.duration_s:.3f}s wall, {result.cpu_s:.3f}s cpu")
    typer.echo(f"verifier:  {result.verifier_name} {result.verifier_version}")
    typer.echo(f"image:     {result.image_digest or '-'}  worker: {result.worker_id}")
    if result.detail:
        typer.echo(f"detail:    {result.detail}")
    for label, text in (("stdout", result.stdout), ("stderr", result.stderr)):
        if text:
            typer.echo(f"--- {label}{' (truncated)' if result.truncated else ''} ---")
            typer.echo(text.rstrip("\n"))


@sandbox_app.command("exec")
def exec_(
    ctx: typer.Context,
    code: Annotated[Path, typer.Option(help="The candidate's code (or answer text).", **_FILE)],
    tests: Annotated[
        Path | None, typer.Option(help="python_tests: file of test_* functions.", **_FILE)
    ] = None,
    cases: Annotated[
        Path | None,
        typer.Option(help='stdin_stdout: JSON list of {"stdin","stdout"} (or JSONL).', **_FILE),
    ] = None,
    verifier: Annotated[
        str | None,
        typer.Option(help="python_tests | stdin_stdout | math_answer | exact | regex."),
    ] = None,
    answer: Annotated[str | None, typer.Option(help="math_answer/exact: reference.")] = None,
    pattern: Annotated[str | None, typer.Option(help="regex: the pattern.")] = None,
    timeout: Annotated[float, typer.Option(help="Wall-clock limit, seconds.")] = 10.0,
    memory: Annotated[int, typer.Option(help="Memory limit, MiB.")] = 256,
    as_json: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")] = False,
) -> None:
    """Run one job in a fresh hardened container and print the result and its reward.
    Exit code: 0 when it passed, 1 otherwise."""
    import asyncio

    from sandbox_workers.rewards import reward
    from services.cli_common import settings_from
    from services.sandbox_wiring import docker_sandbox

    settings = settings_from(ctx, **{"sandbox.pool_size": 1})
    request = _request(
        code, tests, cases, verifier, answer=answer, pattern=pattern, timeout_s=timeout,
        memory_mb=memory,
    )  # fmt: skip

    async def run() -> Any:
        sandbox = await docker_sandbox(settings, "cli")
        try:
            return await sandbox.run(request)
        finally:
            await sandbox.close()

    try:
        result = asyncio.run(run())
    except RuntimeError as exc:  # no image, no engine: say what to do, no traceback
        typer.echo(f"rollstream: {exc}", err=True)
        raise typer.Exit(2) from exc
    _print(result, reward(result.outcome, result.passed, result.total, settings.rewards), as_json)
    raise typer.Exit(0 if result.outcome.value == "passed" else 1)


@sandbox_app.command("reap")
def reap(ctx: typer.Context) -> None:
    """Remove sandbox containers whose owning worker on this host is gone."""
    from sandbox_workers.reaper import reap_orphans
    from services.cli_common import settings_from
    from services.infra import docker_engine

    client = docker_engine.client(settings_from(ctx))
    try:
        typer.echo(f"removed {reap_orphans(client)} orphaned sandbox containers")
    finally:
        client.close()


def worker(
    ctx: typer.Context,
    prefix: Annotated[str | None, typer.Option(help="Topic prefix (topics.prefix).")] = None,
    worker_id: Annotated[
        str | None, typer.Option(help="Stable, unique worker id (sandbox.worker_id).")
    ] = None,
    pool_size: Annotated[
        int | None, typer.Option(help="Warm containers = concurrent jobs (sandbox.pool_size).")
    ] = None,
    metrics_port: Annotated[
        int | None, typer.Option(help="Prometheus port on 127.0.0.1 (0: off).")
    ] = None,
) -> None:
    """Serve sandbox.requests -> sandbox.results until SIGTERM (exactly-once, see
    sandbox_workers/service.py)."""
    import asyncio
    import logging
    import signal

    early: list[int] = []  # a SIGTERM while importing and starting still means a clean stop
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, _frame: early.append(signum))

    from services.cli_common import settings_from
    from services.sandbox_wiring import serve

    settings = settings_from(
        ctx,
        **{
            "topics.prefix": prefix,
            "sandbox.worker_id": worker_id,
            "sandbox.pool_size": pool_size,
            "sandbox.worker_metrics_port": metrics_port,
        },
    )
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("aiokafka").setLevel(logging.WARNING)
    raise typer.Exit(asyncio.run(serve(settings, early_stop=early)))


def register(app: typer.Typer) -> None:
    """Add this area's commands to the root app: `sandbox exec|reap`, `sandbox-worker`."""
    app.add_typer(sandbox_app, name="sandbox")
    app.command("sandbox-worker")(worker)
