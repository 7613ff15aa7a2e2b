"""Does more synthetic data hurt?  One method's macro-F1 at a small and a large N, paired by seed.

Issue 22's target: on at least four of the five tasks, macro-F1 at N = 1,200 is no worse than at
N = 300 (three seeds).  "Worse" is the project's rule: the paired difference (large − small) is
below zero beyond its standard deviation; a task with fewer seeds than asked is *not yet measured*
unless it is already worse.  The verdict is "met" once enough tasks are measured and not worse,
"not met" once too many are worse for the rest to make up, and "not yet" in between.

    python -m benchmarks.quality.more_data --small benchmarks/results/more_data_n300.json \\
        --large benchmarks/results/more_data_n1200.json --method wasp

reads two ``grid.py`` JSONs (the same tasks, split and settings but N) and writes
``benchmarks/results/more_data.{md,json,png}``.  The runs themselves come from ``grid.py``.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Any

from benchmarks import report
from benchmarks.quality.grid_report import by_seed
from benchmarks.quality.lever_rule import vetoes
from benchmarks.quality.seed_stats import fmt, fmt_diff, paired_diff

METRIC = "macro_f1"


def compare(small: dict[str, dict], large: dict[str, dict], method: str) -> dict[str, dict[str, Any]]:
    """Per task both JSONs hold ``method`` for: its values at each N and ``large − small`` by seed."""
    out = {}
    for task in [t for t in large if t in small]:
        a, b = small[task].get(method), large[task].get(method)
        if a is None or b is None:
            continue
        diff = paired_diff(by_seed(b, METRIC), by_seed(a, METRIC))
        out[task] = {"small": by_seed(a, METRIC), "large": by_seed(b, METRIC), "diff": diff}
    return out


def verdict(per_task: dict[str, dict[str, Any]], tasks: int, need: int, min_seeds: int) -> dict[str, Any]:
    """The target on ``tasks`` tasks: ``need`` of them measured on ``min_seeds`` seeds and not worse."""
    worse = [t for t, row in per_task.items() if vetoes(row["diff"])]
    measured = [t for t, row in per_task.items() if row["diff"] and len(row["diff"]["seeds"]) >= min_seeds]
    not_worse = [t for t in measured if t not in worse]
    if len(not_worse) >= need:
        status = "met"
    elif len(worse) > tasks - need:
        status = "not met"
    else:
        status = "not yet"
    return {"status": status, "not_worse": not_worse, "worse": worse,
            "short_of_seeds": [t for t in per_task if t not in measured and t not in worse],
            "unmeasured": tasks - len(per_task)}  # fmt: skip


def tables(payload: dict[str, Any]) -> list[report.Table]:
    s = payload["settings"]
    rows = []
    for task, row in payload["per_task"].items():
        diff = row["diff"]
        rows.append([task, fmt(list(row["small"].values()), 3), fmt(list(row["large"].values()), 3),
                     fmt_diff(diff), ", ".join(map(str, diff["seeds"])) if diff else "-",
                     "worse" if vetoes(diff) else "no worse"])  # fmt: skip
    v = payload["verdict"]
    notes = [
        f"target: on at least {s['need']} of {s['tasks']} tasks, N = {s['n_large']} no worse than "
        f"N = {s['n_small']} over {s['min_seeds']} seeds: **{v['status']}**",
        f"no worse with {s['min_seeds']} seeds: {', '.join(v['not_worse']) or 'none'}; worse: "
        f"{', '.join(v['worse']) or 'none'}; fewer seeds: {', '.join(v['short_of_seeds']) or 'none'}; "
        f"tasks not run: {v['unmeasured']}",
    ]
    columns = [
        "task",
        f"N = {s['n_small']}",
        f"N = {s['n_large']}",
        "large − small (paired)",
        "seeds",
        "verdict",
    ]
    return [report.Table(f"{s['method']}: macro-F1 (test split) at two sizes", columns, rows, notes)]


def plot(payload: dict[str, Any], path: Path) -> None:
    """Per task, one line per seed from the small N to the large N (red: worse beyond its spread)."""
    plt = report.pyplot()
    s = payload["settings"]
    per_task = payload["per_task"]
    fig, axes = plt.subplots(
        1, max(len(per_task), 1), figsize=(2.6 * max(len(per_task), 1), 3.2), squeeze=False
    )
    for ax, (task, row) in zip(axes[0], per_task.items(), strict=False):
        colour = "tab:red" if vetoes(row["diff"]) else "tab:blue"
        for seed in row["diff"]["seeds"] if row["diff"] else []:
            ax.plot([0, 1], [row["small"][seed], row["large"][seed]], marker="o", color=colour)
            ax.annotate(
                f"s{seed}", (1, row["large"][seed]), fontsize=7, xytext=(3, 0), textcoords="offset points"
            )
        ax.set_xticks([0, 1], [f"N={s['n_small']}", f"N={s['n_large']}"])
        ax.set_xlim(-0.3, 1.4)
        ax.set_title(task, fontsize=9)
    axes[0][0].set_ylabel(f"{s['method']} macro-F1 (test)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def size_of(payload: dict[str, Any], path: Path) -> int:
    n = payload.get("settings", {}).get("n")
    if not isinstance(n, int):
        raise SystemExit(f"{path}: no settings.n; is it a grid.py JSON?")
    return n


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--small", type=Path, required=True, help="a grid.py JSON at the smaller N")
    p.add_argument("--large", type=Path, required=True, help="a grid.py JSON at the larger N")
    p.add_argument("--method", default="wasp", help="the method key compared (default wasp)")
    p.add_argument("--tasks", type=int, default=5, help="how many tasks the target counts (default 5)")
    p.add_argument("--need", type=int, default=4, help="tasks that must be no worse (default 4)")
    p.add_argument("--min-seeds", type=int, default=3, help="paired seeds a task needs (default 3)")
    p.add_argument("--out", type=Path, default=report.RESULTS)
    p.add_argument("--name", default="more_data")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    if not 1 <= args.need <= args.tasks or args.min_seeds < 1:
        raise SystemExit("need 1 <= --need <= --tasks and --min-seeds >= 1")
    if missing := [str(path) for path in (args.small, args.large) if not path.is_file()]:
        raise SystemExit(f"no such file: {', '.join(missing)}")
    small, large = (report.read_json(path) for path in (args.small, args.large))
    n_small, n_large = size_of(small, args.small), size_of(large, args.large)
    if n_small >= n_large:
        raise SystemExit(f"--small has N = {n_small}, --large N = {n_large}: the larger N goes to --large")
    per_task = compare(small["tasks"], large["tasks"], args.method)
    if not per_task:
        raise SystemExit(f"no task holds {args.method!r} in both {args.small} and {args.large}")
    settings = {"small": str(args.small), "large": str(args.large), "method": args.method,
                "n_small": n_small, "n_large": n_large, "tasks": args.tasks, "need": args.need,
                "min_seeds": args.min_seeds}  # fmt: skip
    payload = report.start(__file__, sys.argv[1:] if argv is None else argv, settings)
    payload["per_task"] = per_task
    payload["verdict"] = verdict(per_task, args.tasks, args.need, args.min_seeds)
    title = "More data: macro-F1 at two sizes, paired by seed"
    report.write_all(args.out, args.name, title, report.finish(payload), tables(payload), plot)


if __name__ == "__main__":
    main()
