"""rollstream's asynchronous pipeline vs the classic synchronous RL loop vs TRL, in one run.

Same tasks, same initial policy (one supervised warm-up, shared), same learner settings,
same Docker sandbox (a warm pool of `--pool` hardened containers), same task mix (in (a)
a backed-up sandbox tier pauses every suite, `feeder.sandbox_backpressure = "all"`), same
machine, for `--seeds` seeds each:

(a) async: the demo's pipeline (benchmarks/pipeline_async.py) for `--minutes`;
(b) sync: one process, sample a batch -> score it all -> one step (pipeline_sync.py);
(c) TRL's GRPOTrainer on a GPT-2 built from a config of the same size, in its own
    virtualenv (`--trl-python`, default .venv-trl/bin/python; pipeline_trl.py).

Workload: `arith` (in-process verifier) and `pyslow`, the `pyfunc` tasks whose tests first
sleep a heavy-tailed time inside the sandbox (`--cost pareto`: alpha 1.2, 50 ms scale;
`--cost lognormal`: median 0.1 s, sigma 1.5; capped at 6 s under a 10 s job limit).
Calibrated (`--calibrate K`, benchmarks/pipeline_calibrate.py): the shared initial policy
samples K completions of every training task first, and every mode (TRL included) is fed
only the tasks whose pass rate lies in `feeder.pass_band`. Both modes' learners leave out
samples of advantage 0 (`learner.skip_no_signal`).

Reported: time-to-target (wall seconds until the held-out greedy pass of arith, measured
on weight snapshots every `--eval-every` seconds off the clock, first reaches the target
both modes reach in median: the lower of the two modes' median final values), medians
over seeds, `time-to-target ratio` (sync / async) with an 80% bootstrap interval over
seeds, samples/s and their ratio, stale drops (% of the samples the learner settled), the
lowest throughput after the first minute vs half the median rate, TRL's samples/s and
reward per minute. Writes
<report-dir>/<bench prefix>/pipeline.json and throughput.png.

    .venv/bin/python benchmarks/pipeline.py [--minutes 3] [--seeds 3] [--pool 16]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rich.console import Console  # noqa: E402

from benchmarks import pipeline_measure as pm  # noqa: E402
from benchmarks.cpu import busy_cpu_s  # noqa: E402
from schemas.rollout import Task  # noqa: E402
from services import suites  # noqa: E402
from services.settings import Settings, load  # noqa: E402
from services.suites.arith import MAX_A  # noqa: E402


def slow_tasks(group_size: int, cost: str) -> list[Task]:
    """The pyfunc train tasks, renamed to suite `pyslow`, tests sleeping first."""
    import msgspec

    out, sleep = [], pm.cost_code(cost)
    for t in suites.get("pyfunc", group_size=group_size).tasks("train"):
        spec = msgspec.structs.replace(t.verifier, tests=sleep + (t.verifier.tests or ""))
        out.append(
            msgspec.structs.replace(
                t, task_id=t.task_id.replace("pyfunc", "pyslow"), suite="pyslow", verifier=spec
            )
        )
    return out


def bench_settings(
    args: argparse.Namespace, prefix: str, task_file: Path, seed: int, calibration: str = ""
) -> Settings:
    share, arith = args.slow_share, pm.arith_suite(args.arith_max)
    extra = [f"feeder.calibration={calibration}"] if calibration else []
    # feeder.frontier needs the calibration: the warm-up's and calibration's settings go without
    sets = [x for x in args.set if calibration or not x.startswith("feeder.frontier")]
    base = load(
        [
            "demo.policy=tiny", f"demo.prefix={prefix}", f"demo.budget_minutes={args.minutes}",
            f"demo.report_dir={args.report_dir}", "demo.live=false",
            f"demo.eval_tasks={args.eval_tasks}", "demo.drain_s=10",
            f"sandbox.pool_size={args.pool}", f"feeder.suites={arith}={1 - share},pyslow={share}",
            f"feeder.task_files={task_file}", f"feeder.seed={seed}",
            # the same task mix in both modes: a backed-up sandbox tier pauses every suite
            f"feeder.max_sandbox_backlog={args.max_sandbox_backlog}",
            f"feeder.sandbox_backpressure={args.backpressure}",
            f"learner.seed={seed}", f"generator.seed={seed}", *extra, *sets,
        ]
    )  # fmt: skip
    from services.demo import run_settings

    return run_settings(base)


def initial_state(s: Settings, max_a: int = MAX_A) -> dict[str, Any]:
    import torch

    from learner.spec import make_policy
    from services.models import resolved
    from services.rollout import warmup
    from services.rollout.textcodec import for_policy

    torch.set_num_threads(1)
    policy = make_policy(resolved(s))
    pairs = warmup_pairs(max_a)
    mix = {pairs[0][0].suite: 0.7, "pyfunc": 0.3}
    warm = s.model_copy(update={"feeder": s.feeder.model_copy(update={"suites": mix})})
    warmup.supervised(policy, for_policy(policy), pairs, warm)
    return policy.weights()


def warmup_pairs(max_a: int = MAX_A) -> list[tuple[Task, str]]:
    """The supervised warm-up's examples: `arith` (of the pool's universe) and `pyfunc`."""
    pyfunc = suites.get("pyfunc")
    return [(t, t.reference or "") for t in pm.arith_tasks("warmup", max_a)] + [
        (t, pyfunc.example(t)) for t in pyfunc.tasks("warmup")
    ]


# -- one run per mode and seed --------------------------------------------------------------


def run_one(mode: str, args: argparse.Namespace, ctx: dict[str, Any], seed: int) -> dict:
    from benchmarks.pipeline_async import async_run
    from benchmarks.pipeline_sync import sync_run

    prefix = f"{ctx['prefix']}-{mode}{seed}"
    s = bench_settings(args, prefix, ctx["task_file"], seed, ctx["calibration"])
    wall0, busy0 = time.monotonic(), busy_cpu_s()
    if mode == "sync":
        tasks, threads = ctx["tasks"], args.sync_threads
        raw = asyncio.run(
            sync_run(s, ctx["state"], tasks, args.minutes, args.eval_every, threads, args.sync_lag)
        )
        raw["times"] = [t for t, _ in raw["log"]]
    else:
        s = s.model_copy(update={"demo": s.demo.model_copy(update={
            "budget_minutes": args.minutes + args.startup_s / 60})})  # fmt: skip
        raw = asyncio.run(async_run(s, ctx["state"], ctx["console"], args.eval_every, args.minutes))
    # share of the machine's CPU busy during the run (async: start-up and drain included)
    raw["cpu_busy"] = (busy_cpu_s() - busy0) / ((time.monotonic() - wall0) * (os.cpu_count() or 1))
    raw["heldout"] = asyncio.run(pm.curve(s, raw.pop("snapshots"), args.eval_tasks, args.arith_max))
    # [[learner version of the snapshot, held-out pass]]: learning per step, for both modes
    versions = raw.pop("snapshot_steps")
    raw["heldout_steps"] = [[v, p] for v, (_, p) in zip(versions, raw["heldout"], strict=True)]
    raw["throughput"] = pm.rates(raw.pop("times"), until=raw["seconds"])
    samples = raw.get("samples", len(raw["log"]))
    raw.update(seed=seed, samples=samples, samples_per_s=samples / max(raw["seconds"], 1e-9))
    raw["stale_pct"] = 100.0 * raw["stale_drops"] / max(1, raw["settled"])
    minutes: dict[int, list[float]] = {}
    for t, r in raw.pop("log"):
        minutes.setdefault(int(t // 60), []).append(r)
    raw["reward_per_minute"] = [round(sum(v) / len(v), 4) for _, v in sorted(minutes.items())]
    ctx["console"].print({k: v for k, v in raw.items() if k != "throughput"})
    return raw


def run_trl(args: argparse.Namespace, ctx: dict[str, Any], seed: int) -> dict[str, Any]:
    s: Settings = ctx["settings"]
    arith = [t for t in ctx["tasks"] if not t.verifier.needs_sandbox]
    n_slow = round(len(arith) * args.slow_share / max(1e-9, 1 - args.slow_share))
    slow = [t for t in ctx["tasks"] if t.verifier.needs_sandbox]
    rows = [{"prompt": t.prompt, "answer": t.verifier.answer} for t in arith]
    rows += [{"prompt": slow[i % len(slow)].prompt, "answer": None} for i in range(n_slow)]
    ls = s.learner
    cfg = {
        "tasks": rows, "warmup": [[t.prompt, a] for t, a in warmup_pairs(args.arith_max)],
        "warmup_steps": s.demo.warmup_steps, "seed": seed, "dim": ls.tiny_dim,
        "layers": ls.tiny_layers, "heads": ls.tiny_heads, "max_seq_len": ls.max_seq_len,
        "pool": args.pool, "cost": args.cost, "group_size": s.feeder.group_size,
        "prompts_per_step": args.trl_prompts, "max_new_tokens": s.generator.max_new_tokens,
        "lr": ls.lr, "minutes": args.minutes, "out": str(ctx["out_dir"] / f"trl{seed}"),
    }  # fmt: skip
    path = ctx["out_dir"] / f"trl{seed}.json"
    path.write_text(json.dumps(cfg))
    script = str(ROOT / "benchmarks" / "pipeline_trl.py")
    proc = subprocess.run(
        [str(args.trl_python), script, str(path)], capture_output=True, text=True,
        cwd=ctx["out_dir"], timeout=args.minutes * 60 + 600,
    )  # fmt: skip
    (ctx["out_dir"] / f"trl{seed}.log").write_text(proc.stdout + proc.stderr)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith('{"mode": "trl"')]
    if proc.returncode or not lines:
        return {"mode": "trl", "error": f"exit {proc.returncode}: {proc.stderr[-500:]}"}
    out: dict[str, Any] = json.loads(lines[-1])
    ctx["console"].print(out)
    return out


# -- the report -------------------------------------------------------------------------------


def summarize(runs: dict[str, list[dict]]) -> dict[str, Any]:
    """Medians over seeds, the target both modes reach, time-to-target and the ratios."""
    final = {m: pm.median([r["heldout"][-1][1] for r in rs]) for m, rs in runs.items()}
    target = min(final["sync"], final["async"])
    out: dict[str, Any] = {"target": target, "final_heldout": final}
    for m, rs in runs.items():
        for r in rs:
            r["time_to_target"] = pm.time_to(r["heldout"], target)
            r["steps_to_target"] = pm.time_to(r.get("heldout_steps", []), target)
        out[m] = {
            "time_to_target": pm.median([r["time_to_target"] for r in rs]),
            "steps_to_target": pm.median([r["steps_to_target"] for r in rs]),
            "trained_per_step": pm.median([r.get("trained", 0) / max(1, r["steps"]) for r in rs]),
            "samples_per_s": pm.median([r["samples_per_s"] for r in rs]),
            "stale_pct": pm.median([r["stale_pct"] for r in rs]),
            "cpu_busy": pm.median([r["cpu_busy"] for r in rs]),
            "flat_groups": pm.median([r["flat_groups"] for r in rs]),
            "all_failed": pm.median([r["all_failed"] for r in rs]),
            "all_passed": pm.median([r["all_passed"] for r in rs]),
            "initial_heldout": rs[0]["heldout"][0][1],
        }
    a, b = out["async"], out["sync"]
    curves = {m: [r["heldout"] for r in rs] for m, rs in runs.items()}
    out["ttt_ratio"] = pm.ttt_ratio(curves)
    out["ttt_ratio_80"] = pm.ttt_ratio_interval(curves)
    out["sps_ratio"] = a["samples_per_s"] / max(b["samples_per_s"], 1e-9)
    dips = [pm.dip(r["throughput"]) for r in runs["async"]]
    out["async_dip"] = [{"median": round(m, 2), "lowest_after_60s": round(lo, 2),
                         "ok": not lo < m / 2} for m, lo in dips]  # fmt: skip
    return out


def report(
    runs: dict[str, list[dict]], trl: list[dict], out_dir: Path, console: Console, argv: dict
) -> None:
    """Print the comparison; write pipeline.json (with `argv`, the run's options) and the
    plot."""
    sm = summarize(runs)
    console.rule("[bold]asynchronous pipeline vs synchronous loop vs TRL GRPOTrainer")
    console.print(f"target held-out greedy pass {sm['target']:.3f} (initial "
                  f"{sm['async']['initial_heldout']:.3f}); medians over seeds")  # fmt: skip
    console.print(f"{'mode':<6} {'samples/s':>9} {'t-to-target':>11} {'final':>6} "
                  f"{'stale %':>7}  reward per minute (per seed)")  # fmt: skip
    for m in ("async", "sync"):
        x, rs = sm[m], runs[m]
        console.print(
            f"{m:<6} {x['samples_per_s']:>9.2f} {x['time_to_target']:>10.0f}s "
            f"{sm['final_heldout'][m]:>6.3f} {x['stale_pct']:>7.2f}  "
            f"{[r['reward_per_minute'] for r in rs]}"
        )
    ok = [t for t in trl if "error" not in t]
    for t in trl:
        if "error" in t:
            console.print(f"trl    failed: {t['error']}")
    if ok:
        sps = pm.median([t["samples_per_s"] for t in ok])
        console.print(f"{'trl':<6} {sps:>9.2f} {'-':>11} {'-':>6} {'-':>7}  "
                      f"{[t['reward_per_minute'] for t in ok]}")  # fmt: skip
    lo, hi = sm["ttt_ratio_80"]
    console.print(f"time-to-target ratio {sm['ttt_ratio']:.2f} (80% bootstrap interval over "
                  f"seeds {lo:.2f}-{hi:.2f})")  # fmt: skip
    console.print(f"samples/s ratio {sm['sps_ratio']:.2f}")
    steps = {m: f"{sm[m]['steps_to_target']:.0f}" for m in ("async", "sync")}
    console.print(f"learner steps to target: async {steps['async']}, sync {steps['sync']} "
                  "(medians; inf: not reached)")  # fmt: skip
    console.print(f"samples trained per learner step: async {sm['async']['trained_per_step']:.0f}, "
                  f"sync {sm['sync']['trained_per_step']:.0f} (medians)")  # fmt: skip
    console.print(f"stale drops {sm['async']['stale_pct']:.2f}% (async, median)")
    console.print(f"machine CPU busy: async {sm['async']['cpu_busy']:.0%}, "
                  f"sync {sm['sync']['cpu_busy']:.0%} (medians)")  # fmt: skip
    flat = {m: f"{sm[m]['flat_groups']:.0%} (all failed {sm[m]['all_failed']:.0%}, all passed "
               f"{sm[m]['all_passed']:.0%})" for m in ("async", "sync")}  # fmt: skip
    console.print(f"groups whose rewards were all equal (no signal): async {flat['async']}, "
                  f"sync {flat['sync']} (medians)")  # fmt: skip
    console.print(f"throughput after the first minute (async): {sm['async_dip']}")
    (out_dir / "pipeline.json").write_text(
        json.dumps({"args": argv, "summary": sm, "runs": runs, "trl": trl}, indent=1, default=str)
    )
    plot(runs, out_dir / "throughput.png")
    console.print(f"written: {out_dir / 'pipeline.json'}, {out_dir / 'throughput.png'}")


def plot(runs: dict[str, list[dict]], path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(12, 4.5))
    for m, style in (("async", "-"), ("sync", "--")):
        for r in runs[m]:
            pts = r["throughput"]
            ax.plot([p[0] for p in pts], [p[1] for p in pts], style, label=f"{m} s{r['seed']}")
            h = r["heldout"]
            bx.plot([p[0] for p in h], [p[1] for p in h], style, label=f"{m} s{r['seed']}")
        if m == "async" and runs[m]:
            med = pm.median([pm.dip(r["throughput"])[0] for r in runs[m]])
            ax.axhline(med / 2, color="grey", lw=0.8, label="half the async median")
    ax.axvline(60, color="grey", ls=":", lw=0.8)
    ax.set(xlabel="wall-clock seconds", ylabel="scored samples/s (10 s buckets)",
           title="throughput over time")  # fmt: skip
    bx.set(xlabel="wall-clock seconds", ylabel="held-out greedy pass (arith)",
           title="held-out vs time")  # fmt: skip
    ax.legend(fontsize=7)
    bx.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--minutes", type=float, default=3.0, help="wall-clock budget per run")
    ap.add_argument("--seeds", type=int, default=3, help="runs per mode")
    ap.add_argument("--modes", default="sync,async", help="which of the two to run")
    ap.add_argument("--sync-threads", type=int, default=1,
                    help="(b): torch CPU threads (0: torch's default, one per core)")  # fmt: skip
    ap.add_argument("--sync-lag", type=int, default=0, metavar="N",
                    help="(b): sample each batch with the weights of N learner steps before "
                    "(the staleness of (a) without its asynchrony; 0: on-policy)")  # fmt: skip
    ap.add_argument("--pool", type=int, default=16, help="sandbox containers (all modes)")
    ap.add_argument("--slow-share", type=float, default=0.3, help="weight of pyslow tasks")
    ap.add_argument("--cost", choices=sorted(pm.COSTS), default="pareto",
                    help="distribution of the verification cost of pyslow tasks")  # fmt: skip
    ap.add_argument("--calibrate", type=int, default=16, metavar="K",
                    help="samples per training task measuring the initial policy's pass rate; "
                    "only tasks in feeder.pass_band are fed, in every mode (0: all)")  # fmt: skip
    ap.add_argument("--arith-max", type=int, default=MAX_A, metavar="A",
                    help="arith tasks a+b with a < A: 100, the built-in suite (614 train, "
                    "193 held-out); 1000, a pool ten times larger (suite arithw, fed from "
                    "the task file; `--eval-tasks` spread over its held-out split)")  # fmt: skip
    ap.add_argument("--eval-tasks", type=int, default=193, help="held-out arith tasks (193: all)")
    ap.add_argument("--eval-every", type=float, default=10.0, help="seconds between snapshots")
    ap.add_argument("--max-sandbox-backlog", type=int, default=96,
                    help="(a): sandbox requests waiting before a pause; 0: never")  # fmt: skip
    ap.add_argument("--backpressure", choices=("all", "suites"), default="all",
                    help="(a): what pauses then; `all` keeps (b)'s task mix")  # fmt: skip
    ap.add_argument("--startup-s", type=float, default=30.0,
                    help="(a): extra budget for its processes to start (not measured)")  # fmt: skip
    ap.add_argument("--trl-python", type=Path, default=ROOT / ".venv-trl" / "bin" / "python")
    ap.add_argument("--trl-seeds", type=int, default=1, help="TRL runs (0: none)")
    ap.add_argument("--trl-prompts", type=int, default=4, help="TRL prompts per step")
    ap.add_argument("--set", action="append", default=[], help="extra settings KEY=VALUE")
    ap.add_argument("--report-dir", "--out", type=Path, default=ROOT / "runs")
    return ap.parse_args()


def main() -> None:
    import msgspec

    args = parse_args()
    console = Console()
    prefix = time.strftime("bench-%Y%m%d-%H%M%S")
    out_dir = args.report_dir / prefix
    out_dir.mkdir(parents=True, exist_ok=True)
    slow = slow_tasks(group_size=8, cost=args.cost)
    arith = pm.arith_tasks("train", args.arith_max)
    wide = pm.arith_suite(args.arith_max) != "arith"
    fed = slow + arith if wide else slow  # the wider pool is fed from the file
    task_file = out_dir / "tasks.jsonl"
    task_file.write_text("".join(msgspec.json.encode(t).decode() + "\n" for t in fed))
    s = bench_settings(args, f"{prefix}-x", task_file, 0)
    console.print(f"warm-up of the shared initial policy; results in {out_dir}")
    ctx = {"prefix": prefix, "task_file": task_file, "state": initial_state(s, args.arith_max),
           "tasks": arith + slow, "console": console,
           "settings": s, "out_dir": out_dir, "calibration": ""}  # fmt: skip
    if args.calibrate:  # every mode gets the tasks the initial policy passes in the band
        from benchmarks.pipeline_calibrate import calibrate

        path = out_dir / "calibration.json"
        ctx["tasks"] = calibrate(s, ctx["state"], ctx["tasks"], args.calibrate,
                                 pm.cost_code(args.cost), path, console)  # fmt: skip
        ctx["calibration"] = str(path)
    runs: dict[str, list[dict]] = {"async": [], "sync": []}
    for seed in range(args.seeds):
        for mode in args.modes.split(","):
            console.rule(f"[bold]{mode}, seed {seed}")
            runs[mode].append(run_one(mode, args, ctx, seed))
    if not (runs["async"] and runs["sync"]):  # one mode only: its runs, no comparison
        doc = {"args": vars(args), "runs": runs}
        (out_dir / "pipeline.json").write_text(json.dumps(doc, indent=1, default=str))
        return
    trl = []
    for seed in range(args.trl_seeds):
        console.rule(f"[bold]TRL GRPOTrainer, seed {seed}")
        trl.append(run_trl(args, ctx, seed))
    report(runs, trl, out_dir, console, vars(args))


if __name__ == "__main__":
    main()
