"""The utility check's intervals: how often they cover the score they estimate, and how wide they are.

The check (``--utility-check-share``) releases noisy confusion matrices of three task models on the
M records that voted and reads them into macro-F1 intervals (:mod:`wasp_vllm.privacy.utility`).  An
interval is right when it covers the task model's score on the population the records come from;
a split of the same data set stands in for that population.  Here the three task models are
trained on public stand-ins, with no generation: logistic regression on ``--train`` records of the
fit split (the synthetic set's place), on ``--reference-train`` others (the zero-shot reference's
place), and the nearest label description.  For every task, seed and M: the M records of the fit
split the check scores are drawn at random, disjoint from the stand-ins; the matrices are noised
with the sigma a run with these settings plans (M drawn: the replace relation); the intervals are
computed as a run computes them; and each is checked against the same task model's macro-F1 on
``--split`` (validation to choose the interval's method, test for the table).  The stand-ins are
independent of the M records, as a DP synthetic set nearly is: what a real run adds (the records
that score also voted) is its optimism, measured by the suite's runs, not here.

    python -m benchmarks.utility_check [--quick] [--split validation|test] [--seeds 20]
    python -m benchmarks.utility_check --from-json R.json --grid G.json   # adds the real runs' table

writes ``utility_check.{md,json,png}``; the JSON keeps ``{"coverage": {M: share}, "half_width": {M:
median}}`` for each M measured; ``--from-json FILE`` re-renders a saved result.  ``--grid FILE``
adds what real runs say (a quality grid's results with the ``wasp-utility-check`` method beside
``wasp``): the check's estimate on the private records less the split's score (the optimism of
scoring on the records that voted), whether its interval covers the split's score, and the
macro-F1 the check's share costs, paired by seed.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import bench_cli, report

NAME = "utility_check"
TITLE = "The utility check's intervals: coverage and width"
#: What each interval estimates, in the order the JSON lists them.
KINDS = ("synthetic", "zero-shot reference", "label descriptions", "lead over zero-shot",
         "lead over descriptions")  # fmt: skip
log = logging.getLogger(NAME)


@dataclass(frozen=True)
class Settings:
    tasks: tuple[str, ...] = ()  # () = every task of the suite
    m: tuple[int, ...] = (100, 300, 1000)
    seeds: int = 20
    split: str = "test"
    train: int = 300
    reference_train: int = 30
    share: float = 0.1
    epsilon: float = 4.0
    delta: float = 1e-5
    rounds: int = 5
    q: int = 8
    #: records of the split the truth is measured on (a random draw, fixed per task; the whole split
    #: where it is smaller): what bounds the embedding time on 2 cores
    truth_records: int = 1000


def make_settings(quick: bool, split: str | None, seeds: int | None) -> Settings:
    s = Settings(tasks=("trec", "drugs"), m=(100, 300), seeds=3) if quick else Settings()
    return bench_cli.override(s, split=split, seeds=seeds)


def check_sigma(s: Settings) -> dict[str, float]:
    """The noise of the check's cells, and of the votes with and without it (a run with these
    settings: M drawn, so the replace relation)."""
    from wasp_vllm.privacy.accountant import PrivacyUnit
    from wasp_vllm.privacy.plan import BudgetShares, plan_privacy

    unit = PrivacyUnit("replace")
    with_check = plan_privacy(s.epsilon, s.delta, s.rounds, s.q, unit=unit,
                              shares=BudgetShares(utility_check=s.share))  # fmt: skip
    without = plan_privacy(s.epsilon, s.delta, s.rounds, s.q, unit=unit)
    assert with_check.utility_sigma is not None and with_check.sigma and without.sigma
    return {"utility_sigma": with_check.utility_sigma, "votes_sigma_with_check": with_check.sigma,
            "votes_sigma_without": without.sigma}  # fmt: skip


@dataclass
class TaskData:
    """One task's records, embedded: the fit split (the private records and the stand-ins come
    from it) and the split the intervals are checked against."""

    task: Any
    fit: tuple[np.ndarray, np.ndarray]
    truth: tuple[np.ndarray, np.ndarray]


def load(task_name: str, s: Settings, embedder: Any) -> TaskData:
    """The task's fit split (as many records as the largest M and the stand-ins need) and its
    ``s.split`` (``s.truth_records`` of it), each a random draw fixed per task, embedded."""
    from wasp_vllm.data.records import load_private, load_test
    from wasp_vllm.tasks import get_task

    task = get_task(task_name)
    fit = load_private(f"{task_name}:fit", task)
    truth = load_test(f"{task_name}:{s.split}", task)
    rng = np.random.default_rng(sum(map(ord, task_name)))

    def drawn(texts: Sequence[str], labels: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
        rows = np.sort(rng.permutation(len(texts))[:n])
        return np.asarray(embedder.encode([texts[i] for i in rows])), np.asarray(labels)[rows]

    needed = max(s.m) + s.train + s.reference_train
    return TaskData(
        task, drawn(fit.texts, fit.labels, needed), drawn(truth.texts, truth.labels, s.truth_records)
    )


def one_draw(data: TaskData, m: int, seed: int, s: Settings, sigma: float, embedder: Any) -> dict[str, Any]:
    """One check: intervals of the three task models on M drawn records, and their truths."""
    from sklearn.metrics import f1_score

    from wasp_vllm.evaluation.descriptions import description_prototypes, nearest_description
    from wasp_vllm.pipeline.utility_check import task_model
    from wasp_vllm.privacy.mechanisms import clean_confusion
    from wasp_vllm.privacy.utility import figures

    (emb, labels), (truth_emb, truth_labels) = data.fit, data.truth
    rng = np.random.default_rng([seed, m, 76])
    order = rng.permutation(len(labels))
    private = order[:m]
    train = order[m : m + min(s.train, len(labels) - m - s.reference_train)]
    reference = order[m + len(train) : m + len(train) + s.reference_train]
    prototypes = description_prototypes(data.task, embedder)

    # the run's own task models (pipeline/utility_check.py), on the stand-ins
    models = [*(task_model(emb[rows], labels[rows], seed) for rows in (train, reference)),
              lambda x: nearest_description(x, prototypes)]  # fmt: skip
    k = len(data.task.labels)
    clean = np.stack([clean_confusion(labels[private], m_(emb[private]), k) for m_ in models])
    check = figures(clean + rng.normal(0.0, sigma, clean.shape), sigma, seed)
    truths = [float(f1_score(truth_labels, m_(truth_emb), average="macro", zero_division=0)) for m_ in models]
    truths += [truths[0] - truths[1], truths[0] - truths[2]]
    intervals = [*(x.macro_f1 for x in check.sets), check.lead_over_zero_shot, check.lead_over_descriptions]
    return {"truth": truths, "estimate": [i.estimate for i in intervals], "low": [i.low for i in intervals],
            "high": [i.high for i in intervals]}  # fmt: skip


def measure(s: Settings) -> dict[str, Any]:
    from benchmarks.quality.harness import CachedEmbedder
    from wasp_vllm.data.suite import SUITE

    embedder, sigmas = CachedEmbedder.on_disk(), check_sigma(s)
    draws: list[dict[str, Any]] = []
    for task in s.tasks or tuple(SUITE):
        data = load(task, s, embedder)
        for m in s.m:
            if len(data.fit[1]) < m + s.reference_train + 30:
                log.info("%s: its fit split holds too few records for M=%d; skipped", task, m)
                continue
            for seed in range(s.seeds):
                draws.append({"task": task, "m": m, "seed": seed,
                              **one_draw(data, m, seed, s, sigmas["utility_sigma"], embedder)})  # fmt: skip
            log.info("%s M=%d: %d draws", task, m, s.seeds)
    return {"sigmas": sigmas, "draws": draws, **summarise(draws)}


def summarise(draws: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Coverage (over every interval of every draw) and the synthetic set's median half-width, per M."""
    out: dict[str, Any] = {"coverage": {}, "half_width": {}, "coverage_by_kind": {}}
    for m in sorted({d["m"] for d in draws}):
        at = [d for d in draws if d["m"] == m]
        hits = np.array([[lo <= t <= hi for t, lo, hi in zip(d["truth"], d["low"], d["high"], strict=True)]
                         for d in at])  # fmt: skip
        out["coverage"][str(m)] = round(float(hits.mean()), 4)
        out["coverage_by_kind"][str(m)] = {
            k: round(float(v), 4) for k, v in zip(KINDS, hits.mean(axis=0), strict=True)
        }
        out["half_width"][str(m)] = round(float(np.median([(d["high"][0] - d["low"][0]) / 2 for d in at])), 4)
    return out


def real_runs(grid: dict[str, Any]) -> dict[str, Any]:
    """From a quality grid's results: per run with the check, its estimate and interval on the
    private records against the split's score; per task and seed, macro-F1 with the check less
    without it."""
    runs = [r for r in grid["runs"] if "error" not in r]
    scored = {(r["task"], r["seed"]): r["macro_f1"] for r in runs if r["method"] == "wasp"}
    rows = []
    for r in runs:
        if r["method"] != "wasp-utility-check" or "utility_check" not in r:
            continue
        (synthetic, *_), split = r["utility_check"]["sets"], r["macro_f1"]
        estimate, low, high = (synthetic["macro_f1"][k] for k in ("estimate", "low", "high"))
        without = scored.get((r["task"], r["seed"]))
        rows.append({"task": r["task"], "seed": r["seed"], "on_private": estimate, "low": low, "high": high,
                     "on_split": split, "optimism": round(estimate - split, 4),
                     "covered": low <= split <= high,
                     "cost": None if without is None else round(without - split, 4)})  # fmt: skip
    return {"split": grid["settings"]["split"], "rows": rows}


def real_runs_table(runs: dict[str, Any]) -> report.Table:
    grid = Path(runs["grid"]).stem  # its files lie beside this table's
    files = ", ".join(f"[{kind}]({grid}{end})" for kind, end in (("table", ".md"), ("JSON", ".json"),
                      ("plot", ".png"), ("junk per round", "_junk.png")))  # fmt: skip
    table = report.Table(
        f"Real runs: the check on the private records against the {runs['split']} split",
        ["task", "seed", "on the private records [interval]", "on the split", "optimism", "covered",
         "WASP without the check − with it"],
        notes=["optimism: the check's estimate less the split's score (the records that score also voted)",
               "the last column: what the check's share of the budget cost the votes, paired by seed",
               f"the grid these runs come from: {files}; this table added by `python -m "
               f"benchmarks.utility_check --from-json RESULT.json --grid {runs['grid']}`"],
    )  # fmt: skip
    for r in runs["rows"]:
        table.rows.append([r["task"], r["seed"], f"{r['on_private']:.3f} [{r['low']:.3f}, {r['high']:.3f}]",
                           f"{r['on_split']:.3f}", f"{r['optimism']:+.3f}", "yes" if r["covered"] else "no",
                           "-" if r["cost"] is None else f"{r['cost']:+.3f}"])  # fmt: skip
    if runs["rows"]:
        optimism = np.array([r["optimism"] for r in runs["rows"]])
        costs = np.array([r["cost"] for r in runs["rows"] if r["cost"] is not None])
        covered = np.mean([r["covered"] for r in runs["rows"]])
        table.rows.append(["mean ± sd", len(optimism), "", "",
                           f"{optimism.mean():+.3f} ± {optimism.std():.3f}", f"{covered:.0%}",
                           f"{costs.mean():+.3f} ± {costs.std():.3f}" if len(costs) else "-"])  # fmt: skip
    return table


def tables(payload: dict[str, Any]) -> list[report.Table]:
    r = payload["results"]
    kinds = report.Table("Coverage of each interval (share of draws whose interval holds the split's score)",
                         ["M", "all", *KINDS, "synthetic's half-width (median)", "draws"])  # fmt: skip
    for m, share in r["coverage"].items():
        n = sum(d["m"] == int(m) for d in r["draws"])
        by = r["coverage_by_kind"][m]
        kinds.rows.append([m, share, *(by[k] for k in KINDS), r["half_width"][m], n])
    sig = r["sigmas"]
    noise = report.Table(
        "What the check costs the votes",
        ["", "sigma"],
        notes=["the check's share of the budget's mu^2 goes to its one release; the votes get the rest"],
    )
    noise.rows += [["the check's cells", sig["utility_sigma"]],
                   ["the votes, with the check", sig["votes_sigma_with_check"]],
                   ["the votes, without it", sig["votes_sigma_without"]]]  # fmt: skip
    return [kinds, noise, *([real_runs_table(payload["real_runs"])] if "real_runs" in payload else [])]


def plot(payload: dict[str, Any], path: Path) -> None:
    plt = report.pyplot()
    r = payload["results"]
    ms = list(r["coverage"])
    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.2))
    left.plot(ms, [r["coverage"][m] for m in ms], marker="o")
    left.axhline(0.9, color="grey", ls="--", lw=1)
    left.set(xlabel="M (records scored)", ylabel="coverage", ylim=(0.5, 1.0), title="coverage (goal 0.9)")
    right.plot(ms, [r["half_width"][m] for m in ms], marker="o")
    right.axhline(0.05, color="grey", ls="--", lw=1)
    right.set(xlabel="M", ylabel="half-width", title="synthetic set's macro-F1 interval")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> None:
    p = bench_cli.parser(__doc__, NAME)
    p.add_argument("--split", choices=("validation", "test"), help="the split whose score is the truth")
    p.add_argument("--seeds", type=int, help="draws per task and M")
    p.add_argument("--grid", type=Path, help="a quality grid's results JSON with wasp-utility-check runs")
    args = p.parse_args(argv)
    if args.grid is not None and not args.grid.is_file():
        p.error(f"--grid {args.grid}: no such file")
    payload = bench_cli.measure_or_load(
        args, argv, __file__, lambda: make_settings(args.quick, args.split, args.seeds), measure
    )
    if args.grid is not None:
        payload["real_runs"] = real_runs(report.read_json(args.grid)) | {"grid": str(args.grid)}
    payload |= {key: payload["results"][key] for key in ("coverage", "half_width")}  # the JSON's headline
    name = NAME if payload["settings"]["split"] == "test" else f"{NAME}_{payload['settings']['split']}"
    report.write_all(args.out, name, TITLE, payload, tables(payload), plot)
    for t in tables(payload):
        sys.stdout.write(t.markdown())


if __name__ == "__main__":
    main()
