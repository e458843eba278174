"""The demo's run report: a PNG plot and a summary table (markdown and JSON).

Plot, four panels: reward vs wall-clock time (all suites and each suite, the held-out
greedy pass rate before and after as markers), reward vs the policy version that sampled
it, throughput (trajectories sampled and scored per second), and staleness (mean version
lag of scored samples) with the outstanding trajectories that pacing bounds.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from services.rollout.evaluate import EvalResult, paired_change
from services.rollout.stats import Row


@dataclass
class Report:
    prefix: str
    minutes: float
    """Minutes the pipeline ran (from the first service start to the stop)."""
    rows: list[Row]
    per_version: dict[int, list[float]]
    before: list[EvalResult]
    after: list[EvalResult]
    accounting: dict[str, Any] = field(default_factory=dict)
    final_version: int = -1
    settings: dict[str, Any] = field(default_factory=dict)

    def heldout_table(self) -> list[tuple[str, float, float, float, float]]:
        """(suite, greedy before, greedy after, sampled before, sampled after)."""
        after = {e.suite: e for e in self.after}
        return [
            (b.suite, b.greedy_pass, after[b.suite].greedy_pass,
             b.sampled_pass, after[b.suite].sampled_pass)
            for b in self.before if b.suite in after
        ]  # fmt: skip

    def heldout_lines(self) -> list[tuple[str, str, str, str, str, str]]:
        """(suite, tasks, greedy before ± SE, after ± SE, change in before-SEs, tasks fixed
        / broken with the change over its paired SE): the binomial standard error of the
        greedy pass rate; the paired one compares the same tasks before and after."""
        after = {e.suite: e for e in self.after}
        out = []
        for b in self.before:
            a = after.get(b.suite)
            if a is None:
                continue
            sigmas = (a.greedy_pass - b.greedy_pass) / b.greedy_se if b.greedy_se else math.nan
            fixed, broken, se = paired_change(b.greedy_passed, a.greedy_passed, b.tasks)
            z = f" ({(fixed - broken) / b.tasks / se:+.1f})" if se else ""
            out.append((b.suite, str(b.tasks), f"{b.greedy_pass:.3f} ± {b.greedy_se:.3f}",
                        f"{a.greedy_pass:.3f} ± {a.greedy_se:.3f}", f"{sigmas:+.1f}",
                        f"+{fixed} / -{broken}{z}"))  # fmt: skip
        return out

    def run_figures(self) -> dict[str, Any]:
        """Samples/s, learner steps (policy versions), mean staleness, all-equal groups."""
        last = self.rows[-1] if self.rows else None
        stale = [r.staleness for r in self.rows if r.staleness is not None]
        return {
            "samples per s": round(last.trajectories / max(1e-9, self.minutes * 60), 3)
            if last else None,
            "learner steps (final policy version)": self.final_version,
            "mean staleness (versions)": round(sum(stale) / len(stale), 2) if stale else None,
            "all-equal groups (no learning signal)": _flat(last),
        }  # fmt: skip


def _flat(last: Row | None) -> str:
    """The share of complete groups that teach nothing, and why: none of their members
    passed, or all did."""
    if last is None or last.flat_groups is None:
        return "none complete"
    return (f"{last.flat_groups:.2f} of {last.groups} (all failed {last.all_failed or 0:.2f}, "
            f"all passed {last.all_passed or 0:.2f})")  # fmt: skip


def _binned(per_version: dict[int, list[float]], bins: int = 40) -> tuple[list[float], list[float]]:
    versions = sorted(v for v in per_version if v >= 0)
    if not versions:
        return [], []
    width = max(1, (versions[-1] + 1) // bins + 1)
    xs, ys = [], []
    for start in range(0, versions[-1] + 1, width):
        total = [per_version[v] for v in range(start, start + width) if v in per_version]
        n = sum(c for _, c in total)
        if n:
            xs.append(start + (width - 1) / 2)
            ys.append(sum(s for s, _ in total) / n)
    return xs, ys


def plot(report: Report, path: Path) -> Path | None:
    """Write the PNG; None when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, ax = plt.subplots(2, 2, figsize=(13, 8.5))
    _reward_panel(ax[0][0], report)
    xs, ys = _binned(report.per_version)
    ax[0][1].plot(xs, ys, marker=".", color="tab:purple")
    ax[0][1].set(xlabel="policy version that sampled", ylabel="mean training reward")
    ax[0][1].set_title("reward vs policy version")
    rows = report.rows
    t = [r.t / 60 for r in rows]
    b = ax[1][0]
    b.plot(t, [r.traj_per_s for r in rows], label="sampled / s")
    b.plot(t, [r.scored_per_s for r in rows], label="scored / s")
    b.set(xlabel="minutes", ylabel="trajectories / s", title="throughput")
    b.legend(fontsize=8)
    c = ax[1][1]
    c.plot(t, [r.staleness for r in rows], color="tab:red", label="staleness (versions)")
    c.set(xlabel="minutes", ylabel="mean version lag of scored samples", title="staleness")
    c2 = c.twinx()
    c2.plot(t, [r.outstanding for r in rows], color="tab:gray", lw=1, label="outstanding")
    c2.set_ylabel("published - consumed by the learner")
    c.legend(loc="upper left", fontsize=8)
    c2.legend(loc="upper right", fontsize=8)
    title = f"rollstream demo {report.prefix}: {report.minutes:.1f} min"
    fig.suptitle(f"{title}, final policy v{report.final_version}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _reward_panel(a: Any, report: Report) -> None:
    rows = report.rows
    t = [r.t / 60 for r in rows]
    a.plot(t, [r.reward for r in rows], color="black", lw=2, label="training reward (all)")
    for suite in sorted({s for r in rows for s in r.suite_reward}):
        a.plot(t, [r.suite_reward.get(suite) for r in rows], lw=1, label=f"training: {suite}")
    end = t[-1] if t else 0.0
    for before, after in zip(report.before, report.after, strict=False):
        label = f"held-out greedy pass: {before.suite}"
        ys = [before.greedy_pass, after.greedy_pass]
        a.plot([0, end], ys, ls="--", marker="D", ms=7, label=label)
    a.set(xlabel="minutes", ylabel="reward / pass rate", title="reward vs time")
    a.legend(fontsize=8)


def _rate(x: float) -> str:
    """A pass rate, or "n/a" when it was not measured (nan: demo.eval_samples 0)."""
    return "n/a" if math.isnan(x) else f"{x:.3f}"


def markdown(report: Report, plot_path: Path | None) -> str:
    last = report.rows[-1] if report.rows else None
    lines = [f"# rollstream demo `{report.prefix}`", ""]
    lines += ["| held-out suite | greedy pass before | after | sampled pass before | after |",
              "|---|---|---|---|---|"]  # fmt: skip
    for suite, gb, ga, sb, sa in report.heldout_table():
        lines.append(f"| {suite} | {gb:.3f} | {ga:.3f} | {_rate(sb)} | {_rate(sa)} |")
    lines += ["", "| held-out suite | tasks | greedy pass@1 before ± SE | after ± SE "
              "| change / SE(before) | tasks fixed / broken (change / paired SE) |",
              "|---|---|---|---|---|---|"]  # fmt: skip
    lines += [f"| {' | '.join(line)} |" for line in report.heldout_lines()]
    lines += ["", "| measure | value |", "|---|---|"]
    lines.append(f"| pipeline minutes | {report.minutes:.2f} |")
    lines.append(f"| final policy version | {report.final_version} |")
    if last is not None:
        mean_rate = last.trajectories / max(1e-9, report.minutes * 60)
        lines.append(f"| trajectories published | {last.trajectories} ({mean_rate:.1f}/s) |")
        lines.append(f"| scored | {last.scored} |")
        lines.append(f"| ledger: trained / dropped / masked | "
                     f"{last.trained} / {last.dropped} / {last.masked} |")  # fmt: skip
        lines.append(f"| dead letters | {last.dead_letters} |")
    for key, value in [*report.run_figures().items(), *report.accounting.items()]:
        lines.append(f"| {key} | {value} |")
    if plot_path is not None:
        lines += ["", f"![learning curves]({plot_path.name})"]
    return "\n".join(lines) + "\n"


def write(report: Report, out_dir: Path) -> tuple[Path | None, Path]:
    """plot.png, report.md and summary.json under `out_dir`."""
    out_dir.mkdir(parents=True, exist_ok=True)
    plot_path = plot(report, out_dir / "plot.png")
    md = out_dir / "report.md"
    md.write_text(markdown(report, plot_path))
    summary = {
        "prefix": report.prefix,
        "minutes": report.minutes,
        "final_version": report.final_version,
        "before": [asdict(e) for e in report.before],
        "after": [asdict(e) for e in report.after],
        "accounting": report.accounting,
        "figures": report.run_figures(),
        "last": report.rows[-1].to_json() if report.rows else None,
        "settings": report.settings,
    }
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    return plot_path, md
