"""`rollstream up`, `down` and `doctor`: the local stack as one unit."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from services.infra import docker_engine, image, kafka, models, redis_local
from services.infra.common import Check, StackError
from services.settings import Settings

COMPONENTS = ("kafka", "redis", "docker", "image", "topics", "model")


def _topics_up(settings: Settings) -> Check:
    from services import topics

    before = asyncio.run(topics.describe(settings))
    created = [s.name for s in before if not s.exists]
    states = asyncio.run(topics.ensure(settings)) if created else before
    problems = [p for s in states for p in s.problems()]
    if problems:
        detail = "; ".join(problems)
    elif created:
        detail = f"created {len(created)} topic(s)"
    else:
        detail = "reused: all declared topics present"
    return Check(
        "topics",
        not problems,
        f"{settings.topics.prefix}.*",
        version=f"{sum(s.exists for s in states)}/{len(states)}",
        detail=detail,
        fix=f"run `rollstream topics ensure --prefix {settings.topics.prefix}`" if problems else "",
    )


UP_STEPS: dict[str, Callable[[Settings], Check]] = {
    "kafka": kafka.up,
    "redis": redis_local.up,
    "docker": docker_engine.up,
    "image": image.up,
    "topics": _topics_up,
    "model": models.up,
}
REQUIRES = {"image": "docker", "topics": "kafka"}


def up(settings: Settings, only: list[str] | None = None, on_step=None) -> list[Check]:  # type: ignore[no-untyped-def]
    """Bring every component (or `only` those) up, idempotently. Never raises for a failed
    component: its Check carries the error and the fix, and dependents are skipped."""
    wanted = [c for c in COMPONENTS if not only or c in only]
    results: dict[str, Check] = {}
    for name in wanted:
        dep = REQUIRES.get(name)
        if dep and dep in results and not results[dep].healthy:
            results[name] = Check(name, False, "", detail=f"skipped: {dep} is not healthy")
        else:
            if on_step:
                on_step(name)
            try:
                results[name] = UP_STEPS[name](settings)
            except StackError as exc:
                results[name] = Check(name, False, "", detail=str(exc), fix="see the message")
        if on_step:
            on_step(None)
    return [results[n] for n in wanted]


def doctor(settings: Settings) -> list[Check]:
    """Health of every component, without starting anything."""
    cluster = kafka.probe(settings)
    checks = [cluster, redis_local.probe(settings), docker_engine.probe(settings)]
    if checks[2].healthy:
        checks.append(image.probe(settings))
    else:
        checks.append(_blocked("image", image.image_ref(settings), "docker"))
    if cluster.healthy:
        from services import topics

        checks.append(topics.check(settings))
    else:
        checks.append(_blocked("topics", f"{settings.topics.prefix}.*", "kafka"))
    # One line per node of a multi-node local cluster, after the cluster's line.
    checks[1:1] = kafka.probe_nodes(settings, cluster)
    checks.append(models.probe(settings))
    return checks


def _blocked(component: str, endpoint: str, dependency: str) -> Check:
    return Check(
        component,
        False,
        endpoint,
        detail=f"{dependency} is down",
        fix=f"bring {dependency} up first: `rollstream up`",
    )


def down(settings: Settings) -> list[tuple[str, bool]]:
    """Stop what `up` started (Kafka node(s), Redis, dockerd), never what it found running.
    Sandbox containers are reaped first, while the engine still answers."""
    reaped = docker_engine.reap_sandboxes(settings)
    stopped = [("sandbox containers", reaped > 0)]
    stopped += kafka.stop_all(settings, timeout_s=30)  # every node, whatever kafka.brokers
    for proc in (redis_local.process(settings), docker_engine.process(settings)):
        stopped.append((proc.name, proc.stop(timeout_s=30)))
    return stopped
