"""rollstream's asynchronous pipeline vs the classic synchronous RL loop, in one run.

Same tasks, same initial policy (one supervised warm-up, shared), same learner settings,
same Docker sandbox (a warm pool of `--pool` hardened containers), same machine:

(a) async: the demo's pipeline (services as processes: feeder, generator, reward
    dispatcher, sandbox worker, learner over Kafka) for `--minutes`;
(b) sync: one process, batch after batch: sample a batch of groups -> score every sample
    (in-process verifier, or the sandbox pool, each job under its timeout) and wait for
    the slowest -> one learner step -> repeat, for `--minutes`.

Tasks: `arith` (in-process verifier) and `pyslow`, the `pyfunc` tasks whose test files
first sleep a heavy-tailed time inside the sandbox (Pareto, alpha 1.2, 50 ms scale,
capped at 6 s under a 10 s job limit): most verifications are quick, a few are very slow,
like real test suites. Reported per mode: scored samples per second, mean reward of the
samples scored in each wall-clock minute, held-out greedy pass rate of the final policy;
and the async/sync ratios. Writes runs/<bench prefix>/pipeline.json and pipeline.png.

    .venv/bin/python benchmarks/pipeline.py [--minutes 2] [--pool 4] [--slow-share 0.3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rich.console import Console  # noqa: E402

from schemas.rollout import Task  # noqa: E402
from services import suites  # noqa: E402
from services.settings import Settings, load  # noqa: E402

SLEEP = (
    "import random as _r, time as _t\n"
    "_t.sleep(min(6.0, 0.05 * _r.paretovariate(1.2)))\n"
)  # fmt: skip


def slow_tasks(group_size: int) -> list[Task]:
    """The pyfunc train tasks, renamed to suite `pyslow`, tests sleeping first."""
    import msgspec

    out = []
    for t in suites.get("pyfunc", group_size=group_size).tasks("train"):
        spec = msgspec.structs.replace(t.verifier, tests=SLEEP + (t.verifier.tests or ""))
        out.append(
            msgspec.structs.replace(
                t, task_id=t.task_id.replace("pyfunc", "pyslow"), suite="pyslow", verifier=spec
            )
        )
    return out


def bench_settings(args: argparse.Namespace, prefix: str, task_file: Path) -> Settings:
    share = args.slow_share
    base = load(
        [
            "demo.policy=tiny",
            f"demo.prefix={prefix}",
            f"demo.budget_minutes={args.minutes}",
            f"demo.report_dir={args.report_dir}",
            "demo.live=false",
            f"demo.eval_tasks={args.eval_tasks}",
            f"sandbox.pool_size={args.pool}",
            f"feeder.suites=arith={1 - share},pyslow={share}",
            f"feeder.task_files={task_file}",
            # the same task mix in both modes: no sandbox-aware pausing of pyslow
            f"feeder.max_sandbox_backlog={args.max_sandbox_backlog}",
        ]
    )
    from services.demo import run_settings

    return run_settings(base)


# -- (b) the synchronous loop -------------------------------------------------------------


async def sync_run(s: Settings, state: dict[str, Any], tasks: list[Task], minutes: float) -> dict:
    import torch

    from learner.spec import make_policy
    from learner.trainer import Trainer, train_config
    from services.models import resolved
    from services.rollout import evaluate
    from services.rollout.sampler import SuiteSampler
    from services.rollout.textcodec import for_policy
    from services.sandbox_wiring import docker_sandbox

    torch.set_num_threads(1)
    policy = make_policy(resolved(s))
    policy.load_weights(state)
    text = for_policy(policy)
    trainer = Trainer(policy, train_config(s.learner), torch.device("cpu"))
    sampler = SuiteSampler(s.feeder.suites, seed=s.feeder.seed)
    sampler.add_all(tasks)
    sandbox = await docker_sandbox(s, f"{s.topics.prefix}-sync")
    judges = {True: evaluate.sandbox_judge(s, sandbox), False: evaluate.in_process_judge(s)}
    rng = torch.Generator().manual_seed(0)
    t0 = time.monotonic()
    log: list[tuple[float, float]] = []  # (seconds since start, reward) per scored sample
    steps = 0
    try:
        while time.monotonic() - t0 < minutes * 60:
            groups = _sample_batch(policy, text, sampler, s, rng)
            scored = await _score(groups, judges, text)
            now = time.monotonic() - t0
            log += [(now, r) for _, rs in scored for r in rs if r is not None]
            batch = _samples(scored)
            if batch:
                await asyncio.to_thread(trainer.step, batch)
                steps += 1
    finally:
        await sandbox.close()
    elapsed = time.monotonic() - t0
    policy.eval()
    held = await _heldout(s, policy, text)
    return _result("sync", log, elapsed, steps, held)


def _sample_batch(policy: Any, text: Any, sampler: Any, s: Settings, rng: Any) -> list[tuple]:
    """Groups (task, prompt ids, completions) until the learner's token budget is full."""
    groups, tokens = [], 0
    while tokens < s.learner.batch_tokens:
        task = sampler.next()
        ids = text.prompt_ids(task)
        cs = policy.sample(
            ids, task.group_size, max_new_tokens=s.generator.max_new_tokens,
            temperature=s.learner.temperature, top_p=s.generator.top_p, generator=rng,
        )  # fmt: skip
        groups.append((task, ids, cs))
        tokens += sum(len(ids) + len(c.tokens) for c in cs)
    return groups


async def _score(groups: list[tuple], judges: dict[bool, Any], text: Any) -> list[tuple]:
    """Score every sample of the batch; returns when the slowest verification is done."""
    jobs = []
    for task, _, cs in groups:
        judge = judges[task.verifier.needs_sandbox]
        jobs.append(asyncio.gather(*(judge(task, text.text(c.tokens)) for c in cs)))
    verdicts = await asyncio.gather(*jobs)
    return [(g, [r for r, _ in v]) for g, v in zip(groups, verdicts, strict=True)]


def _samples(scored: list[tuple]) -> list[Any]:
    import numpy as np

    from learner.sample import Sample
    from streams.groups import group_advantages

    out = []
    for (task, ids, cs), rewards in scored:
        live = [(c, r) for c, r in zip(cs, rewards, strict=True) if r is not None]
        advantages = group_advantages([r for _, r in live])
        for (c, r), a in zip(live, advantages, strict=True):
            if not c.tokens:
                continue
            out.append(
                Sample(
                    trajectory_id="", group_id="", prompt=np.array(ids, np.int32),
                    completion=np.array(c.tokens, np.int32), advantage=a, reward=r,
                    behaviour_logp=np.array(c.logprobs, np.float32), policy_version=0,
                    task_id=task.task_id,
                )
            )  # fmt: skip
    return out


async def _heldout(s: Settings, policy: Any, text: Any) -> float:
    from services.rollout import evaluate

    tasks = suites.get("arith").tasks("heldout")[: s.demo.eval_tasks]
    r = await evaluate.evaluate(policy, text, tasks, evaluate.in_process_judge(s), s, 1)
    return r.greedy_pass


def _result(mode: str, log: list[tuple[float, float]], elapsed: float, steps: int,
            held: float) -> dict:  # fmt: skip
    minutes: dict[int, list[float]] = {}
    for t, r in log:
        minutes.setdefault(int(t // 60), []).append(r)
    return {
        "mode": mode,
        "seconds": round(elapsed, 1),
        "samples": len(log),
        "samples_per_s": round(len(log) / max(elapsed, 1e-9), 2),
        "learner_steps": steps,
        "reward_per_minute": [round(sum(v) / len(v), 4) for _, v in sorted(minutes.items())],
        "heldout_arith_greedy": round(held, 4),
        "curve": _curve(log),
    }


def _curve(log: list[tuple[float, float]], bucket_s: float = 10.0) -> list[list[float]]:
    buckets: dict[int, list[float]] = {}
    for t, r in log:
        buckets.setdefault(int(t // bucket_s), []).append(r)
    return [[(k + 0.5) * bucket_s, sum(v) / len(v)] for k, v in sorted(buckets.items())]


# -- (a) the asynchronous pipeline ----------------------------------------------------------


async def async_run(s: Settings, state: dict[str, Any], console: Console) -> dict:
    from services.demo import Demo

    demo = Demo(s, console)
    demo.initial_state = state
    rc = await demo.run()
    if rc != 0:
        raise RuntimeError(f"the asynchronous run failed (exit {rc}); see {demo.dir}/logs")
    budget_s = s.demo.budget_minutes * 60
    held = next((e.greedy_pass for e in demo.after if e.suite == "arith"), float("nan"))
    log: list[tuple[float, float]] = []  # per-minute means, within the budget only
    for m, (total, n) in sorted(demo.stats.per_minute.items()):
        if m * 60 < budget_s:
            log += [(m * 60 + 30.0, total / n)] * int(n)
    out = _result("async", log, budget_s, demo.final_version, held)
    in_budget = [r for r in demo.rows if r.t <= budget_s]
    out["samples"] = in_budget[-1].scored if in_budget else 0
    out["samples_per_s"] = round(out["samples"] / budget_s, 2)
    out["curve"] = [[r.t, r.reward] for r in in_budget if r.reward is not None]
    return out


def initial_state(s: Settings) -> dict[str, Any]:
    import torch

    from learner.spec import make_policy
    from services.models import resolved
    from services.rollout import warmup
    from services.rollout.textcodec import for_policy

    torch.set_num_threads(1)
    policy = make_policy(resolved(s))
    pairs = [(t, suites.get(n).example(t)) for n in ("arith", "pyfunc")
             for t in suites.get(n).tasks("warmup")]  # fmt: skip
    warm = s.model_copy(
        update={"feeder": s.feeder.model_copy(update={"suites": {"arith": 0.7, "pyfunc": 0.3}})}
    )
    warmup.supervised(policy, for_policy(policy), pairs, warm)
    return policy.weights()


def report(results: list[dict], out_dir: Path, console: Console) -> None:
    a, b = results
    console.rule("[bold]asynchronous pipeline vs synchronous loop")
    console.print(f"{'mode':<7} {'samples':>8} {'samples/s':>10} {'steps':>6} "
                  f"{'held-out':>9}  reward per minute")  # fmt: skip
    for r in results:
        console.print(
            f"{r['mode']:<7} {r['samples']:>8} {r['samples_per_s']:>10.2f} "
            f"{r['learner_steps']:>6} {r['heldout_arith_greedy']:>9.3f}  {r['reward_per_minute']}"
        )
    ratio = a["samples_per_s"] / max(b["samples_per_s"], 1e-9)
    console.print(f"throughput ratio async/sync: {ratio:.2f}x")
    (out_dir / "pipeline.json").write_text(
        json.dumps({"results": results, "ratio": ratio}, indent=2)
    )
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for r in results:
        ax.plot([p[0] / 60 for p in r["curve"]], [p[1] for p in r["curve"]], label=r["mode"])
    ax.set(xlabel="wall-clock minutes", ylabel="mean training reward", title="reward vs time")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out_dir / "pipeline.png", dpi=110)
    console.print(f"written: {out_dir / 'pipeline.json'}, {out_dir / 'pipeline.png'}")


def main() -> None:
    import msgspec

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--minutes", type=float, default=2.0, help="wall-clock budget per mode")
    ap.add_argument("--pool", type=int, default=4, help="sandbox containers (both modes)")
    ap.add_argument("--slow-share", type=float, default=0.3, help="weight of pyslow tasks")
    ap.add_argument("--eval-tasks", type=int, default=193, help="held-out arith tasks")
    ap.add_argument(
        "--max-sandbox-backlog", type=int, default=0,
        help="feeder flow control in (a); 0 (default) keeps the mix equal to (b)'s",
    )  # fmt: skip
    ap.add_argument("--report-dir", type=Path, default=ROOT / "runs")
    args = ap.parse_args()
    console = Console()
    prefix = time.strftime("bench-%Y%m%d-%H%M%S")
    out_dir = args.report_dir / prefix
    out_dir.mkdir(parents=True, exist_ok=True)
    slow = slow_tasks(group_size=8)
    task_file = out_dir / "pyslow.jsonl"
    task_file.write_text("".join(msgspec.json.encode(t).decode() + "\n" for t in slow))
    s = bench_settings(args, f"{prefix}-async", task_file)
    console.print(f"warm-up of the shared initial policy; results in {out_dir}")
    state = initial_state(s)
    tasks = suites.get("arith").tasks("train") + slow
    console.rule("[bold](b) synchronous loop")
    sync = asyncio.run(sync_run(s, state, tasks, args.minutes))
    console.print({k: v for k, v in sync.items() if k != "curve"})
    console.rule("[bold](a) asynchronous pipeline")
    asyn = asyncio.run(async_run(s, state, console))
    report([asyn, sync], out_dir, console)


if __name__ == "__main__":
    main()
