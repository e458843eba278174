"""`rollstream demo`: the main job on the local stack.

Today it brings the stack up, checks every component and runs a job in a hardened
sandbox. The learning pipeline (generators -> dispatcher -> sandboxes -> learner) is
added to this command as its parts land (issues 3-7); see the README's status section.
"""

from __future__ import annotations

from rich.console import Console

from services.settings import Settings

PROBE = "import os, socket; print('uid', os.getuid(), 'sum', sum(range(10**6)))"


def run_demo(settings: Settings) -> int:
    from services.infra import docker_engine, image, stack

    console = Console()
    console.rule("[bold]rollstream demo: local stack")
    checks = stack.up(settings)
    for c in checks:
        mark = "[green]ok[/]" if c.healthy else "[red]DOWN[/]"
        console.print(f"{mark} {c.component:<7} {c.version:<14} {c.endpoint}  {c.detail}")
    if not all(c.healthy for c in checks):
        console.print("[red]the stack is not healthy; see the lines above[/]")
        return 1
    from sandbox_workers.hardening import Limits, container_kwargs

    console.rule("[bold]a job in a hardened sandbox")
    client = docker_engine.client(settings)
    try:
        kwargs = container_kwargs(image.image_ref(settings), Limits())
        out = client.containers.run(command=["python3", "-c", PROBE], remove=True, **kwargs)
    finally:
        client.close()
    console.print(out.decode().strip())
    console.rule()
    console.print(
        "The streaming learning pipeline is not built yet (issues 3-7); this demo stops here."
    )
    return 0
