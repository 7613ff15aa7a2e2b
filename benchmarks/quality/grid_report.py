"""The tables, JSON and plots of ``grid.py``: per task and averaged over tasks, each
method's scores over seeds, the paired differences, and the per-round look of the samples."""

from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import Any

from benchmarks import report
from benchmarks.quality.harness import DELTA, EMBEDDER, EPSILON, PLMS
from benchmarks.quality.round_stats import mean_over_seeds
from benchmarks.quality.seed_stats import METRICS, fmt, fmt_diff, mean_std, paired_diff
from wasp_vllm.data.suite import SUITE

TITLES = {"macro_f1": "macro-F1", "accuracy": "accuracy", "label_agreement": "label agreement", "fid": "FID",
          "kept_share": "kept / generated"}  # fmt: skip
#: Per round, what the loop must not make worse (issue 59): the title, which way is better and why,
#: and what a last round worse than round 0 beyond its spread is called.
DIVERSITY = {
    "same_label_cosine": ("same-label cosine", "lower", "more diverse", "narrower"),
    "distinct_2": ("distinct bigrams", "higher", "more diverse", "narrower"),
    "fid_validation": ("FID of the round to validation", "lower", "nearer the real texts", "farther"),
    # Within each PLM (weighted by its samples): separates the PLMs copying their examples from
    # the round's PLM mix narrowing (one PLM's share growing), which the cosine above holds both.
    "within_plm_cosine": ("same-label cosine within a PLM", "lower", "more diverse", "narrower"),
}


def group_of(task: str) -> str:
    """The task's suite group (docs/suite.md): "choosing", "held-out", or "-" outside the suite."""
    return SUITE.get(task, "-")


def kept_share(run: dict[str, Any]) -> float | None:
    """Samples kept over samples generated (kept + rejected, every reason) in one run."""
    if run.get("kept") is None or run.get("rejects") is None:
        return None
    generated = run["kept"] + sum(run["rejects"].values())
    return run["kept"] / generated if generated else None


def per_task(
    runs: list[dict], metrics: tuple[str, ...] = (*METRICS, "gen_s", "kept_share")
) -> dict[str, dict[str, Any]]:
    """``{task: {"group": its suite group, method: {"seeds": [...], metric: [one value per seed],
    ...}}}`` of finished runs."""
    out: dict[str, dict[str, Any]] = {}
    for r in sorted((r for r in runs if "error" not in r), key=lambda r: r["seed"]):
        task = out.setdefault(r["task"], {"group": group_of(r["task"])})
        entry = task.setdefault(r["method"], {"seeds": []})
        entry["seeds"].append(r["seed"])
        for metric in metrics:
            entry.setdefault(metric, []).append(kept_share(r) if metric == "kept_share" else r.get(metric))
    return out


def group_means(
    tasks: dict[str, dict], names: list[str], order: list[str], metrics: tuple[str, ...] = METRICS
) -> dict[str, dict[str, Any]]:
    """``{"mean GROUP": averaged over that group's tasks}`` where ``names`` span two groups or more
    (with one group, the plain average already is its mean)."""
    groups = list(dict.fromkeys(group_of(t) for t in names))
    if len(groups) < 2:
        return {}
    return {f"mean {g}": averaged(tasks, [t for t in names if group_of(t) == g], order, metrics)
            for g in groups}  # fmt: skip


def by_seed(entry: dict[str, list] | None, metric: str) -> dict[int, Any]:
    return dict(zip(entry["seeds"], entry[metric], strict=True)) if entry else {}


def averaged(
    tasks: dict[str, dict], names: list[str], order: list[str], metrics: tuple[str, ...] = METRICS
) -> dict[str, dict[str, Any]]:
    """Per method, per seed the mean over every task (only seeds every task finished)."""
    out: dict[str, dict[str, Any]] = {}
    for method in order:
        entries = [tasks.get(t, {}).get(method) for t in names]
        if any(e is None for e in entries):
            continue
        seeds = sorted(set.intersection(*(set(e["seeds"]) for e in entries if e)))
        row: dict[str, Any] = {"seeds": seeds}
        for metric in metrics:
            vals = [[by_seed(e, metric)[s] for e in entries] for s in seeds]
            row[metric] = [None if any(v is None for v in vs) else statistics.fmean(vs) for vs in vals]
        out[method] = row
    return out


def paired_all(
    tasks: dict,
    average: dict,
    methods: list[dict],
    metrics: tuple[str, ...] = METRICS,
    means: dict[str, dict] | None = None,
) -> dict[str, dict[str, dict]]:
    """``{task, "average" or a group mean: {"a − b": {metric: paired difference}}}`` for each
    method's pair."""
    out: dict[str, dict[str, dict]] = {}
    for where, table in [*tasks.items(), ("average", average), *(means or {}).items()]:
        for m in methods:
            a, b = m["versus"]
            if a == b or a not in table or b not in table:
                continue
            diffs = {k: paired_diff(by_seed(table[a], k), by_seed(table[b], k)) for k in metrics}
            out.setdefault(where, {})[f"{a} − {b}"] = {k: v for k, v in diffs.items() if v is not None}
    return out


def _columns(names: list[str], means: dict[str, dict]) -> list[str]:
    """Column heads: each task with its suite group, then the average and the group means."""
    return [f"{t} ({group_of(t)})" for t in names] + ["average", *means]


def _metric_table(
    metric: str, tasks: dict, average: dict, names: list[str], labels: dict, means: dict[str, dict]
) -> list[str]:
    digits = 3
    heads = _columns(names, means)
    lines = [f"| {TITLES[metric]} | " + " | ".join(heads) + " |", "|---" * (len(heads) + 1) + "|"]
    for key, label in labels.items():
        cells = [fmt(tasks.get(t, {}).get(key, {}).get(metric, []), digits) for t in names]
        cells += [fmt(table.get(key, {}).get(metric, []), digits) for table in (average, *means.values())]
        if any(c != "-" for c in cells):
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return lines


def _paired_table(metric: str, paired: dict, names: list[str], means: dict[str, dict]) -> list[str]:
    pairs = list(dict.fromkeys(p for where in paired.values() for p in where))
    heads = _columns(names, means)
    lines = [f"| {TITLES[metric]}: a − b | " + " | ".join(heads) + " |", "|---" * (len(heads) + 1) + "|"]
    for pair in pairs:
        cells = [fmt_diff(paired.get(w, {}).get(pair, {}).get(metric)) for w in [*names, "average", *means]]
        lines.append(f"| {pair} | " + " | ".join(cells) + " |")
    return lines


def _round_values(run: dict[str, Any], metric: str) -> dict[int, float]:
    """Per round, one run's ``metric`` over all its PLMs: from its ``diversity`` entries; the
    within-PLM cosine (and, for a record kept before the entries, the same-label cosine) as its
    PLMs' cosines weighted by their counts."""
    if run.get("diversity") and metric != "within_plm_cosine":
        return {e["round"]: e[metric] for e in run["diversity"] if e.get(metric) is not None}
    if metric not in ("same_label_cosine", "within_plm_cosine") or not run.get("rounds"):
        return {}
    out = {}
    for t in sorted({e["round"] for e in run["rounds"]}):
        rows = [e for e in run["rounds"] if e["round"] == t and e.get("similarity") is not None]
        rows = [e for e in rows if e["n"] > 1]
        if rows:
            out[t] = sum(e["n"] * e["similarity"] for e in rows) / sum(e["n"] for e in rows)
    return out


def diversity_change(runs: list[dict]) -> dict[str, dict[str, dict[str, Any]]]:
    """``{task: {method: {metric: last round − round 0, paired by seed}}}`` for each
    :data:`DIVERSITY` metric a run has per round."""
    ends: dict[tuple[str, str, str], tuple[dict[int, float | None], dict[int, float | None]]] = {}
    for r in runs:
        if "error" in r:
            continue
        for metric in DIVERSITY:
            values = _round_values(r, metric)
            if len(values) > 1 and 0 in values:
                first, last = ends.setdefault((r["task"], r["method"], metric), ({}, {}))
                first[r["seed"]], last[r["seed"]] = values[0], values[max(values)]
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for (task, method, metric), (first, last) in ends.items():
        if (diff := paired_diff(last, first)) is not None:
            out.setdefault(task, {}).setdefault(method, {})[metric] = diff
    return out


def narrowed(metric: str, diff: dict[str, Any] | None) -> bool:
    """The last round is less diverse than round 0 beyond the paired spread."""
    if diff is None or diff["verdict"] != "gap":
        return False
    return diff["mean"] > 0 if DIVERSITY[metric][1] == "lower" else diff["mean"] < 0


def signal_shares(runs: list[dict]) -> dict[str, dict[str, list[float]]]:
    """``{task: {method: per seed, the mean signal share of its released votes}}``."""
    out: dict[str, dict[str, list[float]]] = {}
    for r in sorted((r for r in runs if "error" not in r), key=lambda r: r["seed"]):
        shares = [e["signal_share"] for e in r.get("diversity") or [] if e.get("signal_share") is not None]
        if shares:
            out.setdefault(r["task"], {}).setdefault(r["method"], []).append(statistics.fmean(shares))
    return out


def _diversity_table(change: dict, names: list[str], labels: dict) -> list[str]:
    heads = [f"{t} ({group_of(t)})" for t in names]
    lines = ["| last round − round 0 | method | " + " | ".join(heads) + " |", "|---" * (len(heads) + 2) + "|"]
    for metric, (title, better, why, worse) in DIVERSITY.items():
        for key, label in labels.items():
            diffs = [change.get(t, {}).get(key, {}).get(metric) for t in names]
            if any(diffs):
                cells = [fmt_diff(d) + (f" **{worse}**" if narrowed(metric, d) else "") for d in diffs]
                lines.append(f"| {title} ({better}: {why}) | {label} | " + " | ".join(cells) + " |")
    return lines


def rounds_by_task(runs: list[dict]) -> dict[str, dict[str, list[dict]]]:
    """``{task: {method: per-round entries averaged over seeds}}`` of runs with round tables."""
    seeds: dict[str, dict[str, list[list[dict]]]] = {}
    for r in runs:
        if r.get("rounds"):
            seeds.setdefault(r["task"], {}).setdefault(r["method"], []).append(r["rounds"])
    return {t: {m: mean_over_seeds(v) for m, v in per.items()} for t, per in seeds.items()}


def _pooled_agreement(entries: list[dict], rnd: int) -> float | None:
    """Label agreement of one round's samples over all its PLMs (each PLM's weighted by its count)."""
    rows = [e for e in entries if e["round"] == rnd and e.get("label_agreement") is not None and e["n"]]
    total = sum(e["n"] for e in rows)
    return sum(e["n"] * e["label_agreement"] for e in rows) / total if total else None


def label_drift(runs: list[dict]) -> dict[str, dict[str, dict[str, Any]]]:
    """``{task: {method: last round − first round}}`` of the label agreement of a run's samples,
    paired by seed: issue 22 asks that it never fall over the rounds."""
    ends: dict[str, dict[str, tuple[dict[int, Any], dict[int, Any]]]] = {}
    for r in runs:
        if not (entries := r.get("rounds")):
            continue
        rounds = sorted({e["round"] for e in entries})
        first, last = ends.setdefault(r["task"], {}).setdefault(r["method"], ({}, {}))
        first[r["seed"]] = _pooled_agreement(entries, rounds[0])
        last[r["seed"]] = _pooled_agreement(entries, rounds[-1])
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for task, methods in ends.items():
        for method, (first, last) in methods.items():
            if (diff := paired_diff(last, first)) is not None:
                out.setdefault(task, {})[method] = diff
    return out


def _drift_table(drift: dict, names: list[str], labels: dict) -> list[str]:
    lines = ["| label agreement: last round − first | " + " | ".join(names) + " |"]
    lines.append("|---" * (len(names) + 1) + "|")
    for key, label in labels.items():
        cells = [fmt_diff(drift.get(t, {}).get(key)) for t in names]
        if any(c != "-" for c in cells):
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return lines


def _num(x: float | None, digits: int = 3) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f}"


def _rounds_table(rounds: dict, reference: dict[str, float | None], method: str = "wasp") -> list[str]:
    lines = [
        "| task | round | PLM | samples | label agreement | ≥2 emoji/#/@ (real) | 4-gram overlap | "
        "same-label cosine | rejects |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for task, per in rounds.items():
        for e in per.get(method, []):
            rejects = ", ".join(f"{k} {v}" for k, v in sorted(e["rejects"].items(), key=lambda kv: -kv[1]))
            lines.append(
                f"| {task} | {e['round']} | {e['plm']} | {e['n']} | {_num(e['label_agreement'])} | "
                f"{_num(e['junk_share'])} ({_num(reference.get(task))}) | {_num(e['ngram_overlap'])} | "
                f"{_num(e.get('similarity'))} | "
                f"{rejects or '-'} |"
            )
    return lines


def _header(payload: dict[str, Any], stem: Path) -> list[str]:
    s = payload["settings"]
    return [
        *report.header(f"Synthetic-data quality over tasks ({'quick' if s['quick'] else 'grid'})", payload),
        f"Tasks {', '.join(s['tasks'])}, scored on their `{s['split']}` split "
        f"({', '.join(f'{t} {n}' for t, n in payload['n_scored'].items())} records). Private records: "
        f"M={s['m']} drawn from `TASK:fit` by keyed hash (seeded); label agreement: a balanced logistic "
        f"regression trained on `TASK:fit`. PLMs {', '.join(PLMS)} (engine `{s['engine']}`); N={s['n']}, "
        f"T={s['rounds']}, token cap {s['max_new_tokens'] or 'each task’s own'}, ε={EPSILON}, δ={DELTA}, "
        f"{s['run_config']}; embedder {EMBEDDER}; task model: logistic regression on the embeddings. "
        f"Seeds {s['seeds']}; mean ± std over seeds; 'average' is the mean over tasks per seed (seeds "
        "every task finished), 'mean GROUP' the same over one suite group's tasks (docs/suite.md: "
        "defaults are chosen on the choosing group's validation splits; the held-out group's test "
        "splits are scored only for the final table). Paired differences a − b by seed: a gap inside "
        "its std is 'no gap' (one seed: always 'no gap'). Kept / generated: samples kept over samples "
        "written (kept + rejected for any reason).",
        "",
        f"Runs: {len(payload['ran'])} ran, {len(payload['reused'])} reused from `--work` or the results "
        f"JSON, {len(payload['skipped'])} skipped (time budget"
        + ("; the grid is incomplete, so a cell holds the seeds it has" if payload["skipped"] else "")
        + "). Engine start-up "
        f"{payload.get('engine_startup_s', {})} s. Total wall time: {payload.get('total_s', 0) / 60:.1f} min"
        + ("" if payload.get("finished") else " (still running)")
        + ".",
        "",
    ]


def write_outputs(payload: dict[str, Any], stem: Path) -> None:
    names = payload["settings"]["tasks"]
    order = [m["key"] for m in payload["methods"]]
    labels = {m["key"]: m["label"] for m in payload["methods"]}
    tasks = per_task(payload["runs"])
    shown = (*METRICS, "kept_share")
    average = averaged(tasks, names, order, shown)
    means = group_means(tasks, names, order, shown)
    paired = paired_all(tasks, average, payload["methods"], means=means)
    payload |= {"tasks": tasks, "average": average, "group_means": means, "paired": paired}
    payload["rounds"] = rounds_by_task(payload["runs"])
    payload["label_drift"] = label_drift(payload["runs"])
    payload["diversity"] = diversity_change(payload["runs"])
    payload["signal_share"] = signal_shares(payload["runs"])
    report.write_json(stem.with_suffix(".json"), payload)

    md = _header(payload, stem)
    for metric in shown:
        md += [f"## {TITLES[metric]}", "", *_metric_table(metric, tasks, average, names, labels, means), ""]
    if payload["paired"]:
        md += ["## Paired differences (a − b, by seed)", ""]
        for metric in METRICS:
            md += [*_paired_table(metric, payload["paired"], names, means), ""]
    if payload["diversity"]:
        md += ["## Diversity: last round − round 0 (paired by seed)", "",
               "Over all PLMs of a round. **narrower** (**farther**): less diverse (farther from the "
               "real texts) at the last round than at round 0 beyond the paired spread (issue 59: the "
               "loop must not narrow the data). FID of a round: its own samples against the task's "
               "validation split.", "",
               *_diversity_table(payload["diversity"], names, labels), ""]  # fmt: skip
    if payload["signal_share"]:
        cells = "; ".join(f"{t} {m} {fmt(v, 3)}" for t, per in payload["signal_share"].items()
                          for m, v in per.items())  # fmt: skip
        md += ["## Signal share of the released votes", "",
               "Per run the mean over its votes of 1 − σ²/var(H_near) (public: the noisy histogram and "
               f"σ), mean ± std over seeds: {cells}.", ""]  # fmt: skip
    if payload["label_drift"]:
        md += ["## Label agreement over the rounds (last round − first, paired by seed)", "",
               "The label agreement of a round's samples over all its PLMs; a fall beyond its std "
               "means the loop drifts off the labels.", "",
               *_drift_table(payload["label_drift"], names, labels), ""]  # fmt: skip
    if any("wasp" in per for per in payload["rounds"].values()):
        md += [
            "## WASP per round and PLM (mean over seeds)",
            "",
            "Label agreement of the round's samples; share with ≥ 2 emoji, hashtags or mentions (in "
            "brackets: the real `fit` records); mean share of a sample's 4-grams found in the pools "
            "its in-context examples were drawn from (rebuilt from the votes; zero-shot: -); "
            "rejected samples by reason, summed over seeds. Every method's rounds are in the JSON.",
            "",
            *_rounds_table(payload["rounds"], payload["reference_junk_share"]),
            "",
        ]
    errors = [
        f"{r['method']} on {r['task']} seed {r['seed']}: {r['error']}"
        for r in payload["runs"]
        if "error" in r
    ]
    if errors:
        md += ["Failed: " + "; ".join(errors)]
    if skipped := [f"{m} on {t} seed {s}" for t, m, s in payload["skipped"]]:
        md += ["Skipped (time budget): " + ", ".join(skipped)]
    md += ["", f"Plots: `{stem.name}.png` (macro-F1 per task and method, ± std over seeds), "
           f"`{stem.name}_junk.png` (WASP's share of samples with ≥ 2 emoji/#/@ per round).", ""]  # fmt: skip
    stem.with_suffix(".md").write_text("\n".join(md))
    plot_macro_f1(tasks, {"average": average, **means}, names, labels, stem.with_suffix(".png"))
    plot_junk(payload["rounds"], payload["reference_junk_share"], stem.parent / f"{stem.name}_junk.png")


def plot_macro_f1(tasks: dict, averages: dict[str, dict], names: list[str], labels: dict, path: Path) -> None:
    """Macro-F1 per task (labelled with its suite group), then per average (``averages``: the
    overall one and the group means)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = [*names, *averages]
    keys = [k for k in labels if any(k in tasks.get(t, {}) for t in names)]
    if not keys:
        return
    width = 0.8 / len(keys)
    fig, ax = plt.subplots(figsize=(max(6.0, 1.6 * len(groups) + 0.3 * len(keys)), 4.2))
    for i, key in enumerate(keys):
        stats = [mean_std((averages.get(g) or tasks.get(g, {})).get(key, {}).get("macro_f1", []))
                 for g in groups]  # fmt: skip
        means = [0.0 if math.isnan(m) else m for m, _ in stats]
        stds = [s or 0.0 for _, s in stats]
        xs = [j + (i - (len(keys) - 1) / 2) * width for j in range(len(groups))]
        ax.bar(xs, means, width, yerr=stds, capsize=3, label=labels[key])
    ticks = [f"{g}\n({group_of(g)})" if g in names and group_of(g) != "-" else g for g in groups]
    ax.set_xticks(range(len(groups)), ticks, fontsize=8)
    ax.set_ylabel("macro-F1")
    ax.set_ylim(bottom=0.0)
    ax.set_title("macro-F1 per task (mean ± std over seeds)")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_junk(rounds: dict, reference: dict, path: Path, method: str = "wasp") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, ax = plt.subplots(figsize=(7.0, 4.0))
    for i, (task, per) in enumerate(rounds.items()):
        color = f"C{i}"
        for plm, style in zip(PLMS, ("-", "--"), strict=True):
            pts = [(e["round"], e["junk_share"]) for e in per.get(method, []) if e["plm"] == plm]
            pts = [(t, v) for t, v in pts if v is not None]
            if pts:
                ax.plot(*zip(*pts, strict=True), style, marker="o", color=color, label=f"{task} {plm}")
        if reference.get(task) is not None:
            ax.axhline(reference[task], color=color, linestyle=":", alpha=0.6)
    ax.set_xlabel("round")
    locator = ax.xaxis.get_major_locator()
    if isinstance(locator, MaxNLocator):  # the default AutoLocator is one
        locator.set_params(integer=True)
    ax.set_ylabel("share with ≥ 2 emoji / # / @")
    ax.set_title("WASP samples per round (dotted: the real records)")
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:  # a grid without WASP rounds has nothing to name
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
