"""Would the ranking hold on a test set that holds every label equally often?

The five tasks' test splits keep their sources' label mix (issue 22), so a method whose labels
follow that mix (WASP's private label prior does, noisily) trains a classifier with the right prior
for them; a held-out set with an even test split (the one issue 22 reports was) takes that away.
This scores a quality grid's finished runs again, as the grid did (``harness.eval_settings``: the
same split, the same records for OnlyPrivate), and reads both macro-F1 on the split as it is and
``even_mix_macro_f1`` (each test sample weighted by one over its label's count: the expected score
on an even mix), per task, averaged over tasks and paired by seed as the grid pairs its methods.
Scoring only: nothing is generated (4 s a run alone with the grid's embedding cache, 20 s on a busy
machine).  A run already scored in the JSON this is about to rewrite (``--reuse``: the same grid
record, by task, method, seed and recorded macro-F1) keeps its scores there, so a grid that grew
by a few runs on a fresh clone needs the run folders of the new runs only.

    python -m benchmarks.quality.even_mix --results benchmarks/results/quality_tasks.json
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Any

from benchmarks import report
from benchmarks.quality.grid_report import averaged, paired_all, per_task
from benchmarks.quality.seed_stats import fmt, fmt_diff

METRICS = ("macro_f1", "even_mix_macro_f1")


def rescore(record: dict[str, Any], split: str, m: int, embedder: Any) -> dict[str, Any]:
    """One finished run of the grid, scored again: both macro-F1 figures and the split's label mix."""
    from benchmarks.quality.grid import method_table
    from benchmarks.quality.harness import Data, eval_settings
    from wasp_vllm.evaluation import evaluate_private_only, evaluate_synthetic

    method = method_table(m)[record["method"]][0]
    settings = eval_settings(Data(record["task"], split), method, record["seed"])
    if method.only_private:
        scores: Any = evaluate_private_only(settings, embedder=embedder)
    else:
        scores = evaluate_synthetic(
            Path(record["run_dir"]) / "synthetic.parquet", settings, embedder=embedder
        )
    return {"task": record["task"], "method": record["method"], "seed": record["seed"],
            "macro_f1": scores.macro_f1, "even_mix_macro_f1": scores.even_mix_macro_f1,
            "recorded_macro_f1": record["macro_f1"],
            "test_label_counts": scores.classifier.test_label_counts}  # fmt: skip


def _record_key(task: str, method: str, seed: int, macro_f1: float) -> tuple[str, str, int, float]:
    return task, method, seed, macro_f1


def earlier_scores(path: Path) -> dict[tuple[str, str, int, float], dict[str, Any]]:
    """The rows of an earlier even-mix JSON, by the grid record they scored (empty if there is none)."""
    if not path.is_file():
        return {}
    rows = report.read_json(path).get("runs", [])
    return {_record_key(r["task"], r["method"], r["seed"], r["recorded_macro_f1"]): r for r in rows}


def tables(payload: dict[str, Any]) -> list[report.Table]:
    tasks, names = payload["tasks"], list(payload["tasks"])
    methods = list(dict.fromkeys(m for t in tasks.values() for m in t if m != "group"))
    scores = report.Table(
        "Macro-F1 as the split is | on an even label mix (mean ± std over seeds)",
        ["method", *names, "average"],
        [[m, *(_both(tasks.get(t, {}).get(m)) for t in names), _both(payload["average"].get(m))]
         for m in methods],
        ["The split's label mix per task: "
         + "; ".join(f"{t}: {c}" for t, c in payload["test_label_counts"].items())],
    )  # fmt: skip
    pairs = list(dict.fromkeys(p for where in payload["paired"].values() for p in where))
    diffs = report.Table(
        "Paired by seed, a − b: as the split is | on an even label mix",
        ["a − b", *names, "average"],
        [[p, *(_both_diff(payload["paired"].get(w, {}).get(p)) for w in [*names, "average"])] for p in pairs],
        ["'no gap': the mean lies inside its standard deviation over seeds."],
    )  # fmt: skip
    return [scores, diffs]


def _both(entry: dict[str, list] | None) -> str:
    return "-" if entry is None else " \\| ".join(fmt(entry[k], 3) for k in METRICS)


def _both_diff(diffs: dict[str, Any] | None) -> str:
    return "-" if diffs is None else " \\| ".join(fmt_diff(diffs.get(k)) for k in METRICS)


def plot(payload: dict[str, Any], path: Path) -> None:
    """One panel per pair: its paired difference per task, as the split is and on an even mix."""
    plt = report.pyplot()
    pairs = list(dict.fromkeys(p for where in payload["paired"].values() for p in where))
    wheres = [*payload["tasks"], "average"]
    fig, axes = plt.subplots(1, max(len(pairs), 1), figsize=(3.2 * max(len(pairs), 1), 3.2), squeeze=False)
    for ax, pair in zip(axes[0], pairs, strict=False):
        for offset, metric in ((-0.2, "macro_f1"), (0.2, "even_mix_macro_f1")):
            cells = [payload["paired"].get(w, {}).get(pair, {}).get(metric) for w in wheres]
            xs = [i + offset for i, d in enumerate(cells) if d]
            ax.bar(xs, [d["mean"] for d in cells if d], width=0.4, yerr=[d["std"] or 0 for d in cells if d],
                   label="split's mix" if offset < 0 else "even mix")  # fmt: skip
        ax.axhline(0, color="black", linewidth=0.6)
        ax.set_xticks(range(len(wheres)), wheres, rotation=45, fontsize=7)
        ax.set_title(pair, fontsize=8)
    axes[0][0].set_ylabel("macro-F1, a − b")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--results", type=Path, required=True, help="a grid.py JSON whose run folders are here")
    p.add_argument("--methods", default="", help="comma list of the grid's methods (default: all)")
    p.add_argument("--out", type=Path, default=report.RESULTS)
    p.add_argument("--name", default="even_mix")
    p.add_argument(
        "--reuse", type=Path, default=None,
        help="an earlier even-mix JSON whose rows are kept for the runs it scored (default: OUT/NAME.json)",
    )  # fmt: skip
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    if not args.results.is_file():
        p.error(f"--results {args.results}: no such file")
    if args.reuse and not args.reuse.is_file():
        p.error(f"--reuse {args.reuse}: no such file")
    grid = report.read_json(args.results)
    # (the label descriptions' row trains no task model: nothing to score again)
    runs = [r for r in grid["runs"] if "error" not in r and r["method"] != "descriptions"]
    methods = [m for m in args.methods.split(",") if m] or list(dict.fromkeys(r["method"] for r in runs))
    if unknown := sorted(set(methods) - {r["method"] for r in runs}):
        p.error(f"--methods: {', '.join(unknown)} has no finished run in {args.results}")
    runs = [r for r in runs if r["method"] in methods]
    earlier = earlier_scores(args.reuse or args.out / f"{args.name}.json")
    kept = [earlier.get(_record_key(r["task"], r["method"], r["seed"], r["macro_f1"])) for r in runs]
    missing = [r["run_dir"] for r, row in zip(runs, kept, strict=True) if row is None and r.get("run_dir")
               and not (Path(r["run_dir"]) / "synthetic.parquet").is_file()]  # fmt: skip
    if missing:
        p.error(f"{len(missing)} run folders of {args.results} are not here, e.g. {missing[0]}")
    payload = report.start(__file__, sys.argv[1:] if argv is None else argv, {"results": str(args.results)})
    from benchmarks.quality.harness import CachedEmbedder

    embedder = CachedEmbedder.on_disk()
    settings = grid["settings"]
    scored = [
        row or rescore(r, settings["split"], settings["m"], embedder)
        for r, row in zip(runs, kept, strict=True)
    ]
    embedder.flush()
    payload["runs"] = scored
    payload["reused"] = sum(row is not None for row in kept)
    payload["largest_rescoring_change"] = max(abs(r["macro_f1"] - r["recorded_macro_f1"]) for r in scored)
    payload["test_label_counts"] = {r["task"]: r["test_label_counts"] for r in scored}
    payload["tasks"] = per_task(scored, METRICS)
    payload["average"] = averaged(payload["tasks"], list(payload["tasks"]), methods, METRICS)
    payload["paired"] = paired_all(payload["tasks"], payload["average"], grid["methods"], METRICS)
    payload["notes"] = [
        f"Scored again from {args.results} (split {settings['split']}); the largest change of "
        f"a run's macro-F1 against its recorded figure: {payload['largest_rescoring_change']:.4f}; "
        f"{payload['reused']} of {len(scored)} runs kept as an earlier scoring of the same record left them."
    ]
    title = "Macro-F1 on an even label mix"
    report.write_all(args.out, args.name, title, report.finish(payload), tables(payload), plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
