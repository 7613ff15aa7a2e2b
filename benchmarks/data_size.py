"""Does more synthetic data help?  Learning curves and per-round figures of finished runs.

Issue 22 asks that macro-F1 at N = 1,200 be no worse than at N = 300, and where it is, for the
cause.  A bigger run differs from a smaller one in two ways: the classifier sees more samples,
and every round writes more of them (the votes rank more samples, the loop runs on).  This reads
finished run folders (``synthetic.parquet`` and ``manifest.json``: benchmark runs on public data
sets) and tells the two apart by training the evaluation's own task model (``fit_predict_logreg``,
fixed C, on the packaged embedder) on parts of one run's output:

* ``random``: random subsets of the output of each size (``--draws`` draws each): the learning
  curve of *these* samples.  Falling, the classifier is hurt by more of the same data;
* ``rounds``: the samples of rounds 0..t together: rising then falling, the later rounds write
  worse data than the early ones;
* ``--margins``: only the samples whose own label's description leads every other label's by at
  least the margin (the label check's score, stricter than the run's), against random subsets of
  the same size: does a stricter label check pick better samples, or only fewer?
* per round: macro-F1 of the round's samples alone, label agreement (a balanced classifier
  trained on ``TASK:fit``, as ``evaluate``), the labels' shares, the mean cosine between two
  samples of one label, and the share of near-duplicates (cosine >= ``NEAR_DUPLICATE`` to an
  earlier sample of the run).

The scored split is ``TASK:SPLIT`` (``--split``; choose on ``validation``).  Scored on the same
split, the whole output's figure is the run record's ``macro_f1`` (checked on two test-split runs:
drugs 0.437, trec 0.449).

    python benchmarks/data_size.py --split validation --name data_size_wasp \\
        runs/bench-tasks-test-n1200/drugs/wasp_s0 runs/bench-tasks-test/drugs/wasp_s0
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from harness import CachedEmbedder, setup_logging
from round_stats import ReferenceJudge, same_label_similarity

log = logging.getLogger("data_size")

SIZES = (75, 150, 300, 600, 1200)
NEAR_DUPLICATE = 0.95


class Scorer:
    """Macro-F1 on ``TASK:SPLIT`` of the evaluation's task model trained on given samples."""

    def __init__(self, task_name: str, split: str, embedder: CachedEmbedder) -> None:
        from wasp_vllm.data.records import load_private
        from wasp_vllm.tasks import get_task

        self.task = get_task(task_name)
        scored = load_private(f"{task_name}:{split}", self.task)
        self.test_y = np.asarray(scored.labels, dtype=np.int64)
        self.test_emb = embedder.encode(scored.texts)

    def score(self, emb: np.ndarray, y: np.ndarray, seed: int) -> tuple[float, np.ndarray, np.ndarray]:
        """Macro-F1, the share of each label among the predictions, and the F1 of each label."""
        from sklearn.metrics import f1_score

        from wasp_vllm.evaluation.classifier import fit_predict_logreg

        if len(np.unique(y)) < 2:  # the evaluation's constant predictor for a single-class set
            pred = np.full_like(self.test_y, int(y[0]))
        else:
            pred = fit_predict_logreg(emb, y, self.test_emb, seed)
        labels = np.arange(len(self.task.labels))
        per_label = f1_score(self.test_y, pred, labels=labels, average=None, zero_division=0)
        shares = np.bincount(pred, minlength=len(labels)) / len(pred)
        return float(f1_score(self.test_y, pred, average="macro", zero_division=0)), shares, per_label

    def macro_f1(self, emb: np.ndarray, y: np.ndarray, seed: int) -> float:
        return self.score(emb, y, seed)[0]

    def shares(self, y: np.ndarray) -> dict[str, float]:
        return _named(self.task.labels, np.bincount(y, minlength=len(self.task.labels)) / len(y))


def _named(labels: Any, values: np.ndarray) -> dict[str, float]:
    return {name: round(float(v), 3) for name, v in zip(labels, values, strict=True)}


def near_duplicate_share(emb: np.ndarray) -> np.ndarray:
    """Per sample: True where an earlier sample of the run has cosine >= ``NEAR_DUPLICATE``."""
    unit = emb / np.maximum(np.linalg.norm(emb, axis=1, keepdims=True), 1e-12)
    cos = unit @ unit.T
    cos[np.triu_indices(len(cos))] = -1.0  # sample i is compared with samples j < i only
    return cos.max(axis=1, initial=-1.0) >= NEAR_DUPLICATE


def random_curve(scorer: Scorer, emb: np.ndarray, y: np.ndarray, seed: int, draws: int) -> list[dict]:
    """Macro-F1 of random subsets of each size in ``SIZES`` below the run's, and of all of it, with
    the mean share of each label the task model predicts and the mean F1 of each label."""
    out = []
    for size in [s for s in SIZES if s < len(y)] + [len(y)]:
        rng = np.random.default_rng([seed, size])
        picks = [rng.choice(len(y), size, replace=False) for _ in range(draws if size < len(y) else 1)]
        scores, predicted, per_label = zip(
            *(scorer.score(emb[idx], y[idx], seed) for idx in picks), strict=True
        )
        out.append({
            "size": size, "macro_f1": float(np.mean(scores)), "std": float(np.std(scores)),
            "predicted_shares": _named(scorer.task.labels, np.mean(predicted, axis=0)),
            "label_f1": _named(scorer.task.labels, np.mean(per_label, axis=0)),
        })  # fmt: skip
    return out


def margin_filter(
    scorer: Scorer,
    embedder: CachedEmbedder,
    emb: np.ndarray,
    y: np.ndarray,
    seed: int,
    draws: int,
    margins: list[float],
) -> list[dict]:
    """Per margin: macro-F1 of the samples whose own label leads the best other label by at least
    the margin (cosine to the labels' descriptions, as the label check), and of random subsets of
    as many samples (mean ± std over ``draws``)."""
    from wasp_vllm.pipeline.label_check import LabelCheck

    if not margins:  # no --margins: skip embedding the label descriptions
        return []
    scores = LabelCheck(scorer.task, embedder).scores(emb)
    own = scores[np.arange(len(y)), y]
    scores[np.arange(len(y)), y] = -np.inf
    lead = own - scores.max(axis=1)
    out = []
    for margin in margins:
        keep = np.flatnonzero(lead >= margin)
        if len(np.unique(y[keep])) < 2:  # nothing left to train a classifier on
            continue
        rng = np.random.default_rng([seed, len(keep)])
        drawn = [scorer.macro_f1(emb[idx], y[idx], seed)
                 for idx in (rng.choice(len(y), len(keep), replace=False) for _ in range(draws))]  # fmt: skip
        kept = scorer.macro_f1(emb[keep], y[keep], seed)
        out.append({"margin": margin, "kept": len(keep), "macro_f1": kept, "random": float(np.mean(drawn)),
                    "random_std": float(np.std(drawn))})  # fmt: skip
    return out


def per_round(
    scorer: Scorer, judge: ReferenceJudge, rows: dict[str, Any], emb: np.ndarray, seed: int
) -> list[dict[str, Any]]:
    """One entry per round: the cumulative and the round-alone macro-F1 and what the samples look like
    (``rows["duplicate"]``: each sample's ``near_duplicate_share``)."""
    agreed = judge.predict(scorer.task.name, rows["text"]) == rows["y"]
    duplicate = rows["duplicate"]
    out = []
    for t in sorted(set(rows["round"].tolist())):
        mine, upto = rows["round"] == t, rows["round"] <= t
        same_label_rows = [
            {"text": rows["text"][i], "label": int(rows["y"][i])} for i in np.flatnonzero(mine)
        ]
        out.append({
            "round": int(t), "n": int(mine.sum()),
            "cumulative_n": int(upto.sum()),
            "cumulative_macro_f1": scorer.macro_f1(emb[upto], rows["y"][upto], seed),
            "round_macro_f1": scorer.macro_f1(emb[mine], rows["y"][mine], seed),
            "label_agreement": float(agreed[mine].mean()),
            "near_duplicates": float(duplicate[mine].mean()),
            "similarity": same_label_similarity(same_label_rows, judge.embedder),
            "label_shares": scorer.shares(rows["y"][mine]),
        })  # fmt: skip
    return out


def one_run(
    run_dir: Path, scorer_of: Callable[[str], Scorer], draws: int, judge: ReferenceJudge, margins: list[float]
) -> dict:
    import pyarrow.parquet as pq

    manifest = json.loads((run_dir / "manifest.json").read_text())
    seed = int(manifest["config"]["seed"])
    scorer = scorer_of(manifest["task"])
    table = pq.read_table(run_dir / "synthetic.parquet", columns=["text", "label", "round"]).to_pydict()
    labels = list(scorer.task.labels)
    rows = {"text": table["text"], "y": np.array([labels.index(x) for x in table["label"]]),
            "round": np.asarray(table["round"])}  # fmt: skip
    emb = judge.embedder.encode(rows["text"])
    rows["duplicate"] = near_duplicate_share(emb)
    curve = random_curve(scorer, emb, rows["y"], seed, draws)
    return {
        "run_dir": str(run_dir), "task": manifest["task"], "seed": seed, "n": len(rows["y"]),
        "method": run_dir.name.rsplit("_s", 1)[0], "random": curve,
        "trained_shares": scorer.shares(rows["y"]), "scored_shares": scorer.shares(scorer.test_y),
        "near_duplicates": float(rows["duplicate"].mean()),
        "rounds": per_round(scorer, judge, rows, emb, seed),
        "margins": margin_filter(scorer, judge.embedder, emb, rows["y"], seed, draws, margins),
    }  # fmt: skip


def write_outputs(runs: list[dict], stem: Path, command: str) -> None:
    stem.parent.mkdir(parents=True, exist_ok=True)
    stem.with_suffix(".json").write_text(json.dumps({"command": command, "runs": runs}, indent=1) + "\n")
    lines = [f"# {stem.name}: more synthetic data, per run", "", f"`{command}`", "",
             "Random subsets of one run's output (mean ± std over draws), then per round: macro-F1 of "
             "rounds 0..t together and of the round alone, label agreement, near-duplicates "
             f"(cosine ≥ {NEAR_DUPLICATE} to an earlier sample), same-label similarity.", ""]  # fmt: skip
    for run in sorted(runs, key=lambda r: (r["task"], r["n"], r["seed"])):
        curve = run["random"]
        lines += [
            f"## {run['task']}, {run['method']}, N = {run['n']}, seed {run['seed']}",
            "",
            "| subset size | " + " | ".join(str(c["size"]) for c in curve) + " |",
            "|---|" + "---|" * len(curve),
            "| macro-F1 | " + " | ".join(f"{c['macro_f1']:.3f} ± {c['std']:.3f}" for c in curve) + " |",
            "| F1 per label | " + " | ".join(_shares(c["label_f1"]) for c in curve) + " |",
            "| predicted labels | " + " | ".join(_shares(c["predicted_shares"]) for c in curve) + " |",
            "",
            f"Trained on {_shares(run['trained_shares'])}; the scored split holds "
            f"{_shares(run['scored_shares'])}.",
            "",
            "| round | n | rounds 0..t | round alone | label agreement | near-duplicates | similarity "
            "| label shares |",
            "|---|---|---|---|---|---|---|---|",
        ]
        lines += [_round_row(r) for r in run["rounds"]] + [""]
        if run.get("margins"):
            lines += ["| label-check margin | kept | macro-F1 of those kept | random subsets as large |",
                      "|---|---|---|---|"]  # fmt: skip
            lines += [f"| {m['margin']} | {m['kept']} | {m['macro_f1']:.3f} | {m['random']:.3f} ± "
                      f"{m['random_std']:.3f} |" for m in run["margins"]] + [""]  # fmt: skip
    stem.with_suffix(".md").write_text("\n".join(lines))
    plot(runs, stem.with_suffix(".png"))


def _shares(named: dict[str, float]) -> str:
    return ", ".join(f"{k} {v:.2f}" for k, v in named.items())


def _round_row(r: dict[str, Any]) -> str:
    sim = "–" if r["similarity"] is None else f"{r['similarity']:.3f}"
    shares = _shares(r["label_shares"])
    return (
        f"| {r['round']} | {r['n']} | {r['cumulative_macro_f1']:.3f} | {r['round_macro_f1']:.3f} "
        f"| {r['label_agreement']:.3f} | {r['near_duplicates']:.3f} | {sim} | {shares} |"
    )


def plot(runs: list[dict], path: Path) -> None:
    """Per task: each run's random-subset curve (solid) and rounds-0..t curve (dashed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = sorted({r["task"] for r in runs})
    fig, axes = plt.subplots(1, len(tasks), figsize=(4 * len(tasks), 3.4), squeeze=False)
    for ax, task in zip(axes[0], tasks, strict=True):
        for run in (r for r in runs if r["task"] == task):
            name = f"N={run['n']} s{run['seed']}"
            curve, rounds = run["random"], run["rounds"]
            sizes, scores, stds = ([c[k] for c in curve] for k in ("size", "macro_f1", "std"))
            line = ax.errorbar(sizes, scores, yerr=stds, marker="o", capsize=2, label=f"{name} random")
            ax.plot(
                [r["cumulative_n"] for r in rounds],
                [r["cumulative_macro_f1"] for r in rounds],
                linestyle="--", marker="x", color=line[0].get_color(), label=f"{name} rounds 0..t",
            )  # fmt: skip
        ax.set_xscale("log")
        ax.set_title(task)
        ax.set_xlabel("synthetic samples trained on")
        ax.set_ylabel("macro-F1")
        ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", type=Path, help="finished run folders")
    parser.add_argument("--split", choices=["validation", "test"], default="validation")
    parser.add_argument("--draws", type=int, default=5, help="random subsets per size")
    parser.add_argument(
        "--margins", default="", help="comma list of label-check margins to filter by (e.g. 0.02,0.04)"
    )
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    parser.add_argument("--name", default="data_size")
    args = parser.parse_args(argv)
    setup_logging()
    try:
        margins = [float(m) for m in args.margins.split(",") if m.strip()]
    except ValueError:
        log.error("--margins %r: a comma list of numbers", args.margins)
        return 2
    needed = ("manifest.json", "synthetic.parquet")
    missing = [str(p) for p in args.runs if not all((p / name).exists() for name in needed)]
    if missing:
        log.error("not a finished run folder: %s", ", ".join(missing))
        return 2
    embedder = CachedEmbedder.on_disk()
    judge = ReferenceJudge(embedder)
    scorer_of = functools.cache(lambda task: Scorer(task, args.split, embedder))  # one per task, not run
    runs = []
    for run_dir in args.runs:
        runs.append(one_run(run_dir, scorer_of, args.draws, judge, margins))
        whole = runs[-1]["random"][-1]
        log.info("%s: macro-F1 of all %d samples %.3f", run_dir, whole["size"], whole["macro_f1"])
    command = "python benchmarks/data_size.py " + " ".join(sys.argv[1:] if argv is None else argv)
    write_outputs(runs, args.out / args.name, command)
    return 0


if __name__ == "__main__":
    sys.exit(main())
