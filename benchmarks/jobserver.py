"""The job server's own CPU per job: this tree's sandbox files vs a baseline revision's.

Each round starts one container per tree with the pool's own profile (root with the three
capabilities, the sandbox limits, no network, read-only root) on the current sandbox
image, with that tree's `deploy/sandbox/files` mounted read-only. Inside it,
benchmarks/jobserver_driver.py starts the job server from the mounted tree and feeds it the
same jobs, one at a time, as the pool would: a passing `add` with 3 tests, a candidate
that does not compile, and a 2-case stdin_stdout program. CPU per job is the container's
cgroup usage less the driver's own: every process of a job (executor, candidate, harness,
killers), nothing of the host's. The trees alternate within each round, so both see the
same background load. Reported: median over rounds per tree, and current / baseline.

    .venv/bin/python benchmarks/jobserver.py [--baseline HEAD] [--n 100] [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sandbox_workers.hardening import SERVER_CAPS, SERVER_USER, Limits, container_kwargs  # noqa: E402
from sandbox_workers.local import LocalRunner  # noqa: E402
from sandbox_workers.sandbox import VerifyingSandbox  # noqa: E402
from services.infra import docker_engine, image  # noqa: E402
from services.settings import load  # noqa: E402
from tests.unit.sandbox_programs import GOOD, io_request, pt_request  # noqa: E402

FILES = "deploy/sandbox/files"
BASE_UID = "270000"
ECHO_SUM = "a, b = map(int, input().split())\nprint(a + b)\n"


def jobs() -> list[dict[str, Any]]:
    """The jobs exactly as the sandbox worker builds them for the pool."""
    sandbox = VerifyingSandbox(LocalRunner(concurrency=1))
    requests = [
        pt_request(GOOD),
        pt_request("def add(a, b:\n    return a +\n"),
        io_request(ECHO_SUM, [("1 2\n", "3\n"), ("5 7\n", "12\n")]),
    ]
    out = []
    for request in requests:
        plugin, problem = sandbox.registry.lookup(request.verifier)
        if plugin is None or not hasattr(plugin, "job"):
            raise RuntimeError(f"no sandboxed verifier for {request.verifier.name}: {problem}")
        out.append(sandbox._job(plugin.job(request), request)[0])
    return out


def baseline_tree(rev: str, into: Path) -> Path:
    """`deploy/sandbox/files` of git revision `rev`, extracted under `into`."""
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", rev, FILES], check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into / FILES


def run_tree(client: Any, ref: str, tree: Path, n: int, job_list: list[dict[str, Any]]) -> dict:
    kwargs = container_kwargs(
        ref, Limits(), {"rollstream.bench": "1"}, user=SERVER_USER, caps=SERVER_CAPS
    )
    kwargs["environment"] = {**kwargs.get("environment", {}), "JOBS": json.dumps(job_list)}
    kwargs["volumes"] = {
        str(tree): {"bind": "/bench/files", "mode": "ro"},
        str(ROOT / "benchmarks"): {"bind": "/bench/driver", "mode": "ro"},
    }
    argv = ["python3", "/bench/driver/jobserver_driver.py", "/bench/files", str(n), BASE_UID]
    out = client.containers.run(command=argv, remove=True, stdout=True, stderr=True, **kwargs)
    return dict(json.loads(out.decode().strip().splitlines()[-1]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--baseline", default="HEAD", help="git revision to compare with")
    ap.add_argument("--n", type=int, default=100, help="rounds of the 3 jobs per container")
    ap.add_argument("--rounds", type=int, default=5, help="alternating rounds of both trees")
    args = ap.parse_args()
    settings = load()
    client = docker_engine.client(settings)
    ref = image.image_ref(settings)
    job_list = jobs()
    with tempfile.TemporaryDirectory(prefix="jobserver-bench-") as tmp:
        trees = {"baseline " + args.baseline: baseline_tree(args.baseline, Path(tmp)),
                 "current tree": ROOT / FILES}  # fmt: skip
        rows: dict[str, list[dict]] = {name: [] for name in trees}
        for r in range(args.rounds):
            for name, tree in trees.items():
                row = run_tree(client, ref, tree, args.n, job_list)
                rows[name].append(row)
                print(f"round {r + 1}: {name:<22} {row['cpu_ms']:6.2f} CPU ms/job, "
                      f"{row['wall_ms']:6.2f} wall ms/job", flush=True)  # fmt: skip
    print(f"{len(job_list)} jobs x {args.n} per container, {args.rounds} rounds; medians")
    print(f"{'tree':<22} {'CPU ms/job':>11} {'wall ms/job':>12} {'unclean':>8}  outcomes")
    med = {}
    for name, rs in rows.items():
        med[name] = statistics.median(r["cpu_ms"] for r in rs)
        wall = statistics.median(r["wall_ms"] for r in rs)
        unclean = sum(r["unclean"] for r in rs)
        print(f"{name:<22} {med[name]:>11.2f} {wall:>12.2f} {unclean:>8}  {rs[-1]['outcomes']}")
    base, cur = med.values()
    print(f"current / baseline CPU per job: {cur / base:.2f}")
    if any(r["unclean"] for rs in rows.values() for r in rs):
        sys.exit("a job did not end clean: the figures above are not valid")


if __name__ == "__main__":
    main()
