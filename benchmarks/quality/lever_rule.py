"""The rule that makes a quality lever a default, in two stages, and its leave-one-task-out check.

The rule (issue 22, made stricter by issue 59), on the task suite's groups (docs/suite.md):

1. *Choosing*: on the validation splits of the choosing group's tasks, the lever is worse than the
   default beyond the paired standard deviation on no task, and better on the mean over tasks (per
   seed the mean over tasks, paired by seed, beyond its standard deviation).  The held-out group's
   validation splits are never looked at (a validation JSON holding them is refused).
2. *Held out*: only a lever stage 1 adopts is then scored on the held-out group's test splits, once;
   it stays only if it is not worse than the old default there: worse beyond the paired spread on
   no held-out task, nor on their mean.  Until those rows exist the verdict is "pending".

Leave one task out (within the choosing group, shown, never deciding): decide on the other tasks'
validation rows alone, then score what was chosen on the left-out task's test split.

    python -m benchmarks.quality.lever_rule \\
        --validation benchmarks/results/quality_tasks_validation_label_check.json \\
        --pairs wasp-label-check-off:wasp --test benchmarks/results/quality_tasks.json

writes ``benchmarks/results/lever_rule.{md,json}`` (``--name`` for another stem).  The runs
themselves come from ``grid.py``: this only reads their JSON.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
from pathlib import Path
from typing import Any

from benchmarks import report
from benchmarks.quality.grid_report import averaged, by_seed, group_of
from benchmarks.quality.seed_stats import fmt_diff, paired_diff
from wasp_vllm.data.suite import SUITE

METRIC = "macro_f1"
# metrics a lever may also be held to (--guards); higher is better on each (even_mix_macro_f1: in
# the JSON of benchmarks/quality/even_mix.py, which scores a grid's runs on an even label mix)
GUARDS = ("accuracy", "label_agreement", "even_mix_macro_f1")


def vetoes(diff: dict[str, Any] | None) -> bool:
    """A paired difference that is worse beyond its standard deviation: the rule's veto."""
    return diff is not None and diff["verdict"] == "gap" and diff["mean"] < 0


def _per_task(rows: dict[str, dict], lever: str, base: str, metric: str) -> dict[str, Any]:
    """``lever − base`` in ``metric`` per task, paired by seed (None where a task lacks either)."""
    return {
        t: paired_diff(by_seed(r.get(lever), metric), by_seed(r.get(base), metric)) for t, r in rows.items()
    }


def decide(
    tasks: dict[str, dict], lever: str, base: str, names: list[str], guards: tuple[str, ...] = ()
) -> dict[str, Any]:
    """The rule on ``names``' validation rows: ``{"adopt", "why", "per_task", "mean", "guarded"}``.
    ``guards`` are further metrics (higher is better) on which the lever may be worse beyond its
    spread on no task either; ``guarded`` holds their paired differences per task."""
    rows = {t: tasks.get(t, {}) for t in names}
    per_task = _per_task(rows, lever, base, METRIC)
    guarded = {m: _per_task(rows, lever, base, m) for m in guards}
    if missing := [t for t, d in per_task.items() if d is None]:
        why = f"no paired rows on {', '.join(missing)}"
        return {"adopt": False, "why": why, "per_task": per_task, "mean": None, "guarded": guarded}
    average = averaged(tasks, names, [lever, base], (METRIC,))  # per seed, the mean over the tasks
    mean = paired_diff(by_seed(average[lever], METRIC), by_seed(average[base], METRIC))
    better = mean is not None and mean["verdict"] == "gap" and mean["mean"] > 0
    worse = [f"{t} ({fmt_diff(d)})" for t, d in per_task.items() if vetoes(d)]
    worse += [f"{t} in {m.replace('_', ' ')} ({fmt_diff(d)})"
              for m, diffs in guarded.items() for t, d in diffs.items() if vetoes(d)]  # fmt: skip
    if worse:
        why = "worse beyond its spread on " + ", ".join(worse)
    elif not better:
        why = f"not better on the mean over tasks ({fmt_diff(mean)})"
    else:
        why = f"better on the mean ({fmt_diff(mean)}) and worse beyond its spread on no task"
    return {"adopt": better and not worse, "why": why, "per_task": per_task, "mean": mean, "guarded": guarded}


def leave_one_out(
    validation: dict[str, dict],
    test: dict[str, dict] | None,
    lever: str,
    base: str,
    test_names: dict[str, str],
    guards: tuple[str, ...] = (),
) -> list[dict[str, Any]]:
    """Per held-out task: the decision on the other tasks, and the chosen method's test scores."""
    names = list(validation)
    rows = []
    for held in names:
        choice = decide(validation, lever, base, [t for t in names if t != held], guards)
        chosen = lever if choice["adopt"] else base
        scores = (test or {}).get(held, {}).get(test_names.get(chosen, chosen))
        rows.append({"held_out": held, "adopt": choice["adopt"], "why": choice["why"], "chosen": chosen,
                     "test_seeds": scores["seeds"] if scores else [],
                     "test_macro_f1": scores[METRIC] if scores else None})  # fmt: skip
    return rows


def test_gain(
    test: dict[str, dict] | None, lever: str, base: str, names: list[str], test_names: dict[str, str]
) -> dict[str, Any] | None:
    """``lever − base`` on the test split, per task and on the mean over ``names`` (paired by seed):
    what the rule would have seen had it looked at test; shown, never used to choose.  Also the
    default's own mean test score over the tasks, the figure the honest one is read against.
    None unless every task has both methods' test rows."""
    rows: dict[str, dict[str, Any]] = {
        t: {m: (test or {}).get(t, {}).get(test_names.get(m, m)) for m in (lever, base)} for t in names
    }
    if any(scores is None for r in rows.values() for scores in r.values()):
        return None
    gain = decide(rows, lever, base, names)
    base_mean = statistics.fmean(statistics.fmean(r[base][METRIC]) for r in rows.values())
    return {"per_task": gain["per_task"], "mean": gain["mean"], "base_macro_f1": base_mean}


def held_out_check(
    test: dict[str, dict] | None, lever: str, base: str, names: list[str], test_names: dict[str, str]
) -> dict[str, Any]:
    """Stage 2 on the held-out group's test rows (``names``): ``{"passes": True/False/None,
    "why", "per_task", "mean"}``; None while a task lacks either method's rows."""
    rows = {t: {m: (test or {}).get(t, {}).get(test_names.get(m, m)) for m in (lever, base)} for t in names}
    per_task = _per_task(rows, lever, base, METRIC)
    if not names or any(d is None for d in per_task.values()):
        missing = [t for t, d in per_task.items() if d is None] or ["the held-out group (no task)"]
        return {"passes": None, "why": f"no paired test rows on {', '.join(missing)}",
                "per_task": per_task, "mean": None}  # fmt: skip
    average = averaged(rows, names, [lever, base], (METRIC,))
    mean = paired_diff(by_seed(average[lever], METRIC), by_seed(average[base], METRIC))
    worse = [f"{t} ({fmt_diff(d)})" for t, d in per_task.items() if vetoes(d)]
    if vetoes(mean):
        worse.append(f"the mean ({fmt_diff(mean)})")
    why = (
        ("worse than the old default beyond its spread on " + ", ".join(worse))
        if worse
        else (f"not worse than the old default on any held-out task (mean {fmt_diff(mean)})")
    )
    return {"passes": not worse, "why": why, "per_task": per_task, "mean": mean}


def verdict(whole: dict[str, Any], held: dict[str, Any]) -> str:
    """The rule's outcome: "adopt" (both stages), "pending" (stage 1 adopts, no held-out rows yet)
    or "keep the default"."""
    if not whole["adopt"] or held["passes"] is False:
        return "keep the default"
    return "adopt" if held["passes"] else "pending"


def split_groups(tasks: list[str]) -> tuple[list[str], list[str]]:
    """``(choosing, held-out)`` task names; a task outside the suite counts as choosing."""
    return [t for t in tasks if group_of(t) != "held-out"], [t for t in tasks if group_of(t) == "held-out"]


def fold_agreement(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """How many leave-one-out folds adopt the lever, and which tasks they hold out.  A lever every
    fold adopts rests on no single task; one that fewer adopt rests on the tasks those folds see
    (the log-probability ceiling: 2 of 4, and its gain did not carry to the test splits)."""
    held = [r["held_out"] for r in rows if r["adopt"]]
    return {"adopting": len(held), "folds": len(rows), "held_out": held}


def honest_mean(rows: list[dict[str, Any]]) -> float | None:
    """The mean over held-out tasks of the chosen method's mean test score (None until every task has one)."""
    means = [statistics.fmean(r["test_macro_f1"]) for r in rows if r["test_macro_f1"]]
    return statistics.fmean(means) if means and len(means) == len(rows) else None


def tables(payload: dict[str, Any]) -> list[report.Table]:
    out = []
    for pair in payload["pairs"]:
        whole = pair["all_tasks"]
        held = pair["held_out"]
        notes = [
            f"**the rule: {pair['verdict']}**",
            f"stage 1, the choosing group's validation splits ({', '.join(whole['per_task'])}): "
            f"{'adopt' if whole['adopt'] else 'keep the default'} ({whole['why']})",
            f"stage 2, the held-out group's test splits ({', '.join(held['per_task']) or 'none'}): "
            + ("not scored, stage 1 keeps the default" if not whole["adopt"] else held["why"])
            + "".join(f"; {t} {fmt_diff(d)}" for t, d in held["per_task"].items() if d and whole["adopt"]),
        ]
        for metric, diffs in whole.get("guarded", {}).items():
            cells = ", ".join(f"{t} {fmt_diff(d)}" for t, d in diffs.items())
            name = metric.replace("_", " ")
            notes.append(f"{name}, lever − default (a guard: worse beyond its spread nowhere): {cells}")
        if drift := pair.get("label_drift"):
            cells = ", ".join(
                f"{t} {fmt_diff(d.get('lever'))} against {fmt_diff(d.get('base'))}" for t, d in drift.items()
            )
            notes.append(
                f"label agreement of the samples, last round − first, lever against default: {cells}"
            )
        agree = pair["fold_agreement"]
        holding = f" (those holding out {', '.join(agree['held_out'])})" if agree["held_out"] else ""
        notes.append(f"leave-one-out folds that adopt it: {agree['adopting']} of {agree['folds']}{holding}")
        honest = pair["honest_test_macro_f1"]
        honest_text = "not yet: some held-out task has no test rows" if honest is None else f"{honest:.3f}"
        if gain := pair.get("test_gain"):
            honest_text += f" (the default on every task: {gain['base_macro_f1']:.3f})"
            cells = ", ".join(f"{t} {fmt_diff(d)}" for t, d in gain["per_task"].items())
            notes.append(f"test split, lever − default (shown, never used to choose): {cells}; "
                         f"mean {fmt_diff(gain['mean'])}")  # fmt: skip
        notes.append(f"honest test macro-F1 (mean over held-out tasks): {honest_text}")
        rows = [[r["held_out"], "adopt" if r["adopt"] else "keep", r["why"], r["chosen"],
                 "-" if not r["test_macro_f1"] else f"{statistics.fmean(r['test_macro_f1']):.3f}",
                 ", ".join(map(str, r["test_seeds"])) or "-"] for r in pair["leave_one_out"]]  # fmt: skip
        columns = [
            "task left out (choosing group)",
            "decision on the other tasks",
            "why",
            "chosen",
            "test macro-F1",
            "test seeds",
        ]
        title = f"{pair['lever']} against {pair['base']}: the rule, and leaving one choosing task out"
        out.append(report.Table(title, columns, rows, notes))
    return out


def _bars(ax: Any, gain: dict[str, Any], offset: float, width: float, label: str, hatch: str = "") -> list:
    """One split's paired gains per task and on the mean (± std; red: worse beyond its spread)."""
    cells = [*gain["per_task"].items(), ("mean", gain["mean"])]
    means = [d["mean"] if d else 0.0 for _, d in cells]
    stds = [(d["std"] or 0.0) if d else 0.0 for _, d in cells]
    colors = ["tab:red" if vetoes(d) else "tab:blue" for _, d in cells]
    xs = [i + offset for i in range(len(cells))]
    ax.bar(xs, means, width, yerr=stds, capsize=3, color=colors, hatch=hatch, label=label, edgecolor="white")
    return [t for t, _ in cells]


def plot(payload: dict[str, Any], path: Path) -> None:
    """Per lever, its paired macro-F1 gain per validation task and on the mean (± std; red: worse
    beyond its spread, the rule's veto), and beside it, hatched, the same on test where it was scored."""
    plt = report.pyplot()
    pairs = payload["pairs"]
    fig, axes = plt.subplots(1, len(pairs), figsize=(4.6 * len(pairs), 3.6), squeeze=False)
    for ax, pair in zip(axes[0], pairs, strict=True):
        whole, test = pair["all_tasks"], pair.get("test_gain")
        width = 0.4 if test else 0.8
        names = _bars(ax, whole, -width / 2 if test else 0.0, width, "validation (the rule)")
        if test:
            _bars(ax, test, width / 2, width, "test (shown only)", hatch="//")
            ax.legend(fontsize=7)
        ax.set_xticks(range(len(names)), names)
        ax.axhline(0.0, color="black", linewidth=0.8)
        agree = pair["fold_agreement"]
        title = (f"{pair['lever']}\n− {pair['base']}: {pair['verdict']}"
                 f" ({agree['adopting']}/{agree['folds']} folds adopt)")  # fmt: skip
        if test and pair["honest_test_macro_f1"] is not None:
            title += f"; honest test {pair['honest_test_macro_f1']:.3f} (default {test['base_macro_f1']:.3f})"
        ax.set_title(title, fontsize=8)
        ax.set_ylabel("paired macro-F1 gain")
        ax.tick_params(axis="x", labelrotation=30, labelsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--validation", type=Path, required=True, help="a grid.py JSON on the validation split")
    p.add_argument(
        "--pairs", required=True, help="lever:default pairs, comma-separated (method keys of that JSON)"
    )
    p.add_argument("--test", type=Path, default=None, help="a grid.py JSON on the test split (optional)")
    p.add_argument(
        "--test-names", default="", help="key=test_key renames, when the test JSON names a method otherwise"
    )
    p.add_argument(
        "--guards",
        default="",
        help="further metrics the lever may be worse on beyond its spread on no task, comma-separated "
        f"({', '.join(GUARDS)}; default none: the rule reads macro-F1 only)",
    )
    p.add_argument("--out", type=Path, default=report.RESULTS)
    p.add_argument("--name", default="lever_rule")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    guards = tuple(g for g in args.guards.split(",") if g)
    if unknown := [g for g in guards if g not in GUARDS]:
        raise SystemExit(f"--guards: unknown metric {', '.join(unknown)} (one of {', '.join(GUARDS)})")
    grid = report.read_json(args.validation)
    validation = grid["tasks"]
    if peeked := split_groups(list(validation))[1]:
        raise SystemExit(
            f"--validation holds the held-out group's validation rows ({', '.join(peeked)}): the rule "
            "chooses on the choosing group alone (docs/suite.md); run that grid without them"
        )
    test = report.read_json(args.test)["tasks"] if args.test and args.test.exists() else None
    held_names = [t for t, g in SUITE.items() if g == "held-out"]
    renames = dict(kv.split("=", 1) for kv in args.test_names.split(",") if kv)
    settings = {"validation": str(args.validation), "test": None if args.test is None else str(args.test),
                "metric": METRIC, "guards": list(guards)}  # fmt: skip
    payload = report.start(__file__, sys.argv[1:] if argv is None else argv, settings)
    payload["pairs"] = []
    for spec in args.pairs.split(","):
        lever, _, base = spec.partition(":")
        if not base or any(m not in entry for m in (lever, base) for entry in validation.values()):
            raise SystemExit(f"--pairs {spec!r}: both methods must be in every task of {args.validation}")
        rows = leave_one_out(validation, test, lever, base, renames, guards)
        whole = decide(validation, lever, base, list(validation), guards)
        drift = {
            t: {"lever": d.get(lever), "base": d.get(base)} for t, d in grid.get("label_drift", {}).items()
        }
        gain = test_gain(test, lever, base, list(validation), renames)
        held = (
            held_out_check(test, lever, base, held_names, renames)
            if whole["adopt"]
            else {
                "passes": None,
                "why": "not scored: stage 1 keeps the default",
                "per_task": {},
                "mean": None,
            }
        )
        payload["pairs"].append({"lever": lever, "base": base, "verdict": verdict(whole, held),
                                 "all_tasks": whole, "held_out": held, "leave_one_out": rows,
                                 "honest_test_macro_f1": honest_mean(rows), "label_drift": drift,
                                 "fold_agreement": fold_agreement(rows),
                                 "test_gain": gain})  # fmt: skip
    title = "Quality levers: the adoption rule (choosing group, then held-out group)"
    report.write_all(args.out, args.name, title, report.finish(payload), tables(payload), plot)


if __name__ == "__main__":
    main()
