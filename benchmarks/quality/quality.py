"""Synthetic-data quality of WASP and its baselines on the packaged drugs.com reviews.

The paper (WASP, arXiv 2502.00245) judges a synthetic set by the accuracy of a task model
trained on it and tested on real data, and by the FID between synthetic and private
embeddings.  This benchmark reproduces the *shape* of its tables on what runs here:

* private data: M records drawn (seeded, label-stratified) from the drugs train split;
  ``RunConfig.seed`` seeds that draw, and ``evaluate_synthetic(private_seed=seed)`` draws
  the very same records for FID;
* PLMs: the two packaged models, ``smollm2`` (chat) and ``gemma3`` (base);
* methods: OnlyPrivate (no DP), FuseGen (both PLMs, zero-shot, no private data), Aug-PE
  with each single PLM, WASP; ablations (no contrast, no weighting, Q, paper vs exact
  accountant); federated WASP vs Pre-Text (10 parties, Dirichlet(1.0) split);
* task model: logistic regression on the sentence embeddings (``evaluate``'s default);
  test set: the drugs test split, used for scoring only - nothing here is chosen on it.

Engines are opened once per PLM and shared by every run (a proxy makes ``Run``'s
``close()`` a no-op); the embedder is shared too.  Runs go seed by seed, so an
interrupted benchmark still has every method on the first seeds, and the JSON / Markdown
are rewritten after every run.

    python -m benchmarks.quality.quality            # full grid, writes benchmarks/results/quality.*
    python -m benchmarks.quality.quality --quick    # CI-sized, writes benchmarks/results/quality_quick.*

The DP noise seed is fixed per run seed (``noise_seed``) so that a benchmark rerun
reproduces its numbers; a real release must leave it unset.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks import report
from benchmarks.quality.harness import (
    AS_PUBLISHED,
    AUTO_ENGINE,
    DELTA,
    EPSILON,
    LEVERS,
    PLMS,
    RESULTS,
    CachedEmbedder,
    Data,
    EnginePool,
    Method,
    Settings,
    log,
    out_of_time,
    run_or_fail,
    setup_logging,
)
from benchmarks.quality.seed_stats import aggregate, fmt, mean_std, paired

# The full grid is cut to fit 90 minutes on the 2-core machine: N=300 instead of the 600
# and at most 64 new tokens per sample (as ``make demo``), because a WASP run of N=60 still takes
# ~77 s of generation here with top-k sampling and shared example draws, i.e. N=600 x 3 seeds of
# the main rows alone would need ~110 min.  The main rows run on every seed; the federated,
# ablation, accountant and Q rows on the first ``--side-seeds`` seed(s) only, after all main rows;
# ``--max-minutes`` (85) skips whatever still does not fit and the Markdown lists it.
# Side groups run in this order after the main rows, each group over all its seeds before the
# next: the paper's ablations first (they must share the main rows' seeds), federated, the
# N-curve (one seed), then the levers, the accountant and the Q grid.
SIDE_GROUPS = ("ablation", "federated", "n-curve", "levers", "accountant", "q")


# --- what to run ----------------------------------------------------------------------------------


def method_grid(quick: bool, federated_m: int, groups: set[str]) -> list[Method]:
    both = list(PLMS)
    out: list[Method] = [
        Method("only-private", "OnlyPrivate (no DP)", "main", only_private=True),
        Method("fusegen", "FuseGen (zero-shot, 2 PLMs)", "main", {"strategy": "fusegen", "plms": both}),
        Method(
            "aug-pe:smollm2",
            "Aug-PE (smollm2)",
            "main",
            {"strategy": "aug-pe", "plms": ["smollm2"], **AS_PUBLISHED},
        ),
    ]
    if not quick:
        out.append(
            Method(
                "aug-pe:gemma3",
                "Aug-PE (gemma3)",
                "main",
                {"strategy": "aug-pe", "plms": ["gemma3"], **AS_PUBLISHED},
            )
        )
    out.append(Method("wasp", "WASP", "main", {"strategy": "wasp", "plms": both}))
    if quick:
        return [m for m in out if m.group in groups]
    wasp = {"strategy": "wasp", "plms": both}
    out += [
        Method("wasp-no-contrast", "WASP w/o contrast", "ablation", {**wasp, "strategy": "wasp-no-contrast"}),
        Method(
            "wasp-no-weighting", "WASP w/o weighting", "ablation", {**wasp, "strategy": "wasp-no-weighting"}
        ),
    ]
    out += [Method(key, label, "levers", {**wasp, **change}) for key, label, change in LEVERS]
    out += [Method(f"wasp-n{n}", f"WASP N={n}", "n-curve", {**wasp, "n": n}) for n in (600, 1200)]
    out += [Method(f"wasp-q{q}", f"WASP Q={q}", "q", {**wasp, "q": q}) for q in (1, 2, 4, 16)]
    out.append(
        Method("wasp-paper-acct", "WASP (paper accountant)", "accountant", {**wasp, "accountant": "paper"})
    )
    fed = {"parties": 10, "dirichlet": 1.0}
    out += [
        Method(
            f"only-private-m{federated_m}",
            f"OnlyPrivate M={federated_m} (no DP)",
            "federated",
            m=federated_m,
            only_private=True,
        ),
        Method(
            "pre-text:smollm2",
            "Pre-Text (smollm2)",
            "federated",
            {"strategy": "pre-text", "plms": ["smollm2"], **fed},
            m=federated_m,
        ),
        Method(
            "pre-text:gemma3",
            "Pre-Text (gemma3)",
            "federated",
            {"strategy": "pre-text", "plms": ["gemma3"], **fed},
            m=federated_m,
        ),
        Method("wasp-fed", "Federated WASP", "federated", {**wasp, **fed}, m=federated_m),
    ]
    return [m for m in out if m.group in groups]


# --- tables and plots -----------------------------------------------------------------------------


def best_single_augpe(by: dict[str, dict]) -> str | None:
    """The Aug-PE PLM with the higher mean accuracy (the paper's 'best single-PLM' convention)."""
    cands = [k for k in ("aug-pe:smollm2", "aug-pe:gemma3") if k in by]
    return max(cands, key=lambda k: by[k]["accuracy"]["mean"]) if cands else None


def wasp_vs_best(by: dict[str, dict]) -> dict[str, Any] | None:
    best = best_single_augpe(by)
    if best is None or "wasp" not in by:
        return None
    wasp = {r["seed"]: r for r in by["wasp"]["runs"]}
    base = {r["seed"]: r for r in by[best]["runs"]}
    seeds = sorted(set(wasp) & set(base))
    out: dict[str, Any] = {"baseline": best, "seeds": seeds}
    for metric in ("accuracy", "macro_f1", "fid"):
        diffs = [wasp[s][metric] - base[s][metric] for s in seeds if wasp[s][metric] is not None]
        mean, std = mean_std(diffs)
        out[metric] = {"diffs": diffs, "mean": mean, "std": std}
    # per seed, against the better of the two Aug-PE runs of that seed (stricter)
    others = [k for k in ("aug-pe:smollm2", "aug-pe:gemma3") if k in by]
    per_seed_max = []
    for s in seeds:
        vals = [r["accuracy"] for k in others for r in by[k]["runs"] if r["seed"] == s]
        per_seed_max.append(wasp[s]["accuracy"] - max(vals))
    out["accuracy_vs_per_seed_max"] = dict(zip(("mean", "std"), mean_std(per_seed_max), strict=True))
    out["accuracy_vs_per_seed_max"]["diffs"] = per_seed_max
    return out


GROUP_TITLES = {
    "main": "Main comparison (shape of the paper's Table 1)",
    "ablation": "Ablation: contrastive prompts and PLM weighting (shape of the paper's Table 4)",
    "q": "Votes per private sample Q (shape of the paper's Q study; Q=8 is the WASP row)",
    "accountant": "Privacy accountant: exact (analytic Gaussian) vs the paper's formula",
    "federated": "Federated: 10 parties, Dirichlet(1.0) label split (shape of the paper's Table 2)",
    "levers": "Issue 15's levers, each flipped against WASP's defaults (paired by seed below the table)",
    "n-curve": "More synthetic data: WASP at N = 300 (the WASP row), 600, 1200",
}


def _table(by: dict[str, dict], keys: list[str]) -> list[str]:
    lines = [
        "| method | M | seeds | accuracy | macro-F1 | label agreement | FID | σ | gen. time / run (s) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for key in keys:
        if key not in by:
            continue
        a = by[key]
        sig = [r.get("sigma") for r in a["runs"]]
        sigma = f"{sig[0]:.3f}" if sig and sig[0] is not None else "-"
        m = a["runs"][0]["m"]
        lines.append(
            f"| {a['label']} | {m} | {len(a['runs'])} | {fmt(a['accuracy']['values'])} | "
            f"{fmt(a['macro_f1']['values'])} | {fmt(a['label_agreement']['values'], 3)} | "
            f"{fmt(a['fid']['values'], 3)} | {sigma} | "
            f"{fmt(a['gen_s']['values'], 0)} |"
        )
    return lines


def write_outputs(payload: dict[str, Any], stem: Path) -> None:
    runs = payload["runs"]
    by = aggregate(runs)
    payload["aggregate"] = {k: {kk: vv for kk, vv in v.items() if kk != "runs"} for k, v in by.items()}
    payload["wasp_vs_best_single_augpe"] = wasp_vs_best(by)
    report.write_json(stem.with_suffix(".json"), payload)

    s = payload["settings"]
    md = [
        *report.header(
            f"Synthetic-data quality: WASP vs baselines ({'quick' if s['quick'] else 'full'})", payload
        ),
        f"Task `{s['dataset']}`; scored on its `{s['split']}` split ({payload.get('n_test', '?')} records; "
        "settings are chosen on `validation`, `test` is used only for the final table). "
        f"Private records: M drawn from `{s['dataset']}:fit` (train minus validation) by keyed hash "
        "(seeded); label agreement: a balanced logistic regression trained on `fit`. "
        f"PLMs: {', '.join(PLMS)} "
        f"(engine `{s['engine']}`); N={s['n']}, T={s['rounds']}, at most {s.get('max_new_tokens')} "
        f"new tokens per sample, top-k 50 sampling, ε={EPSILON}, δ={DELTA}, S=8, "
        f"Q=8 unless stated, exact accountant (add/remove) unless stated; embedder all-MiniLM-L6-v2; "
        f"task model: logistic regression on the embeddings. Seeds {s['seeds']}: the seed draws the "
        "M private records, the federated partition and all "
        "generation seeds; FID is against the same M records. Mean ± std over seeds (std only with ≥ 2 "
        "seeds). σ is the per-round noise std of the votes.",
        "",
        "Engine start-up (once, shared by all runs): "
        f"{payload.get('engine_startup_s', {})} s. Total wall time: {payload.get('total_s', 0) / 60:.1f} min"
        + (" (still running)" if not payload.get("finished") else "")
        + ".",
        "",
    ]
    for group in ("main", "ablation", "levers", "n-curve", "q", "accountant", "federated"):
        keys = [m["key"] for m in payload["methods"] if m["group"] == group]
        if group in ("ablation", "levers", "n-curve", "q", "accountant") and any(k in by for k in keys):
            keys = ["wasp", *keys]
        if group == "q":
            keys = sorted(keys, key=lambda k: 8 if k == "wasp" else int(k.rsplit("q", 1)[1]))
        if not any(k in by for k in keys):
            continue
        md += [f"## {GROUP_TITLES[group]}", "", *_table(by, keys), ""]
        if group in ("ablation", "levers", "n-curve"):
            md += [f"- {line}" for line in (paired(by, k) for k in keys if k != "wasp") if line] + [""]
        if group == "main":
            cmp = payload["wasp_vs_best_single_augpe"]
            if cmp and cmp["seeds"]:
                acc, f1, fd = cmp["accuracy"], cmp["macro_f1"], cmp["fid"]

                def pm(d: dict, digits: int = 4) -> str:
                    return f"{d['mean']:+.{digits}f}" + (
                        f" ± {d['std']:.{digits}f}" if d["std"] is not None else ""
                    )

                md += [
                    f"WASP − best single-PLM Aug-PE ({by[cmp['baseline']]['label']}, the higher mean "
                    f"accuracy), paired by seed over seeds {cmp['seeds']}: accuracy {pm(acc)}, "
                    f"macro-F1 {pm(f1)}, FID {pm(fd, 3)} (negative FID = closer to the private data). "
                    "Against the better Aug-PE of each seed: accuracy "
                    f"{pm(cmp['accuracy_vs_per_seed_max'])}.",
                    "",
                ]
    skipped = payload.get("skipped", [])
    errors = [r for r in runs if "error" in r]
    if skipped:
        md += ["Skipped (time budget): " + ", ".join(f"{k} seed {sd}" for k, sd in skipped), ""]
    if errors:
        md += [
            "Failed runs: " + "; ".join(f"{r['method']} seed {r['seed']}: {r['error']}" for r in errors),
            "",
        ]
    md += [
        "## Every run",
        "",
        "| method | seed | M | accuracy | macro-F1 | FID | FID per round | kept / shortfall "
        "| final weights | generation (s) | evaluation (s) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        if "error" in r:
            continue
        fpr = r.get("fid_per_round") or {}
        fpr_s = ", ".join(f"{v:.2f}" for _, v in sorted(fpr.items(), key=lambda kv: int(kv[0])))
        w = r.get("final_weights") or {}
        w_s = ", ".join(f"{k} {v:.2f}" for k, v in w.items())
        fid_s = "-" if r.get("fid") is None else f"{r['fid']:.3f}"
        kept = f"{r['kept']} / {r['shortfall']}" if "kept" in r else "-"
        md.append(
            f"| {r['label']} | {r['seed']} | {r['m']} | {r['accuracy']:.4f} | {r['macro_f1']:.4f} "
            f"| {fid_s} | {fpr_s or '-'} | {kept} | {w_s or '-'} | {r['gen_s']:.0f} | {r['eval_s']:.0f} |"
        )
    md += [
        "",
        f"Plots: `{stem.name}_accuracy.png` (accuracy per method, mean ± std), "
        f"`{stem.name}_fid_rounds.png` (FID of the cumulative synthetic set per round, mean over seeds; "
        "shape of the paper's Figure 5).",
        "",
    ]
    stem.with_suffix(".md").write_text("\n".join(md))

    from wasp_vllm.evaluation import plot_accuracy, plot_fid_rounds

    order = [m["key"] for m in payload["methods"]]
    for metric in ("accuracy", "macro_f1", "label_agreement"):
        values = {by[k]["label"]: (by[k][metric]["mean"], by[k][metric]["std"]) for k in order if k in by}
        values = {k: v for k, v in values.items() if not math.isnan(v[0])}
        if values:
            plot_accuracy(values, stem.parent / f"{stem.name}_{metric}.png", metric=metric.replace("_", "-"))
    curves: dict[str, dict[int | str, float]] = {}
    for key in (
        "wasp",
        "fusegen",
        "aug-pe:smollm2",
        "aug-pe:gemma3",
        "wasp-fed",
        "pre-text:smollm2",
        "pre-text:gemma3",
    ):
        if key not in by:
            continue
        per: dict[int, list[float]] = {}
        for r in by[key]["runs"]:
            for t, v in (r.get("fid_per_round") or {}).items():
                per.setdefault(int(t), []).append(v)
        if per:
            curves[by[key]["label"]] = {t: statistics.fmean(v) for t, v in per.items()}
    if curves:
        plot_fid_rounds(curves, stem.parent / f"{stem.name}_fid_rounds.png")


# --- main -----------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="CI size: N=60, T=3, 1 seed, 4 methods")
    p.add_argument("--dataset", default="drugs", help="built-in set: drugs or rotten_tomatoes")
    p.add_argument(
        "--split", choices=("validation", "test"), default="test",
        help="what is scored: validation (to choose settings) or test (the final table only)",
    )  # fmt: skip
    p.add_argument("--seeds", type=int, default=None, help="number of seeds (default 3; quick 1)")
    p.add_argument("--out", default=str(RESULTS), help="folder for quality*.md/.json/.png")
    p.add_argument(
        "--engine",
        choices=("auto", "vllm", "hf"),
        default="auto",
        help=f"generation backend; auto = {AUTO_ENGINE} (faster on the 2-core CPU measured)",
    )
    p.add_argument("--n", type=int, default=None, help="synthetic samples per run (default 300; quick 60)")
    p.add_argument("--rounds", type=int, default=None, help="rounds T (default 5; quick 3)")
    p.add_argument(
        "--max-new-tokens", type=int, default=64, help="token cap per sample (default 64, as make demo)"
    )
    p.add_argument(
        "--groups",
        default=None,
        help="comma list of main,ablation,levers,n-curve,q,accountant,federated (default: all; quick: main)",
    )
    p.add_argument(
        "--side-seeds",
        type=int,
        default=1,
        help="seeds for the ablation, Q, accountant and federated rows (default 1)",
    )
    p.add_argument(
        "--only", default=None, help="comma list of method keys to run of the chosen groups (default: all)"
    )
    p.add_argument("--federated-m", type=int, default=300, help="private records M of the federated rows")
    p.add_argument(
        "--max-minutes",
        type=float,
        default=None,
        help="start no new run after this many minutes (default 85; quick none)",
    )
    p.add_argument("--work", default=None, help="run folders (default <repo>/runs/bench-quality[-quick])")
    p.add_argument("--name", default=None, help="output stem (default quality / quality_quick)")
    args = p.parse_args(argv)
    args.seeds = args.seeds or (1 if args.quick else 3)
    args.n = args.n or (60 if args.quick else 300)
    args.rounds = args.rounds or (3 if args.quick else 5)
    default_groups = "main" if args.quick else "main,ablation,levers,n-curve,q,accountant,federated"
    args.groups = set((args.groups or default_groups).split(","))
    if args.max_minutes is None and not args.quick:
        args.max_minutes = 85.0
    repo = Path(__file__).resolve().parents[2]
    args.work = args.work or str(repo / "runs" / ("bench-quality-quick" if args.quick else "bench-quality"))
    suffix = ("" if args.dataset == "drugs" else f"_{args.dataset}") + (
        "" if args.split == "test" else "_validation"
    )
    args.name = args.name or ("quality_quick" if args.quick else "quality") + suffix
    args.engine = AUTO_ENGINE if args.engine == "auto" else args.engine
    return args


def run_order(methods: list[Method], args: argparse.Namespace) -> list[tuple[int, Method]]:
    """Main rows seed by seed first, then the side rows: if the time cap bites, what is lost is
    side rows, never a seed of the main comparison.  Within a seed the rows of the headline
    comparison (WASP vs Aug-PE) come first."""
    first = {"only-private": 0, "wasp": 1, "aug-pe:smollm2": 2, "aug-pe:gemma3": 3}
    ordered = sorted(methods, key=lambda m: first.get(m.key, 9))
    primary = [(s, m) for s in range(args.seeds) for m in ordered if m.group not in SIDE_GROUPS]
    side = [
        (s, m)
        for group in SIDE_GROUPS
        for s in range(1 if group == "n-curve" else min(args.side_seeds, args.seeds))
        for m in methods
        if m.group == group
    ]
    return primary + side


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    data = Data(args.dataset, args.split)
    setup_logging()

    from wasp_vllm.data.records import load_test
    from wasp_vllm.tasks import get_task

    methods = grid = method_grid(args.quick, args.federated_m, args.groups)
    if args.only:
        wanted = set(args.only.split(","))
        if unknown := wanted - {m.key for m in methods}:
            raise SystemExit(f"--only: no method {sorted(unknown)} in the groups {sorted(args.groups)}")
        methods = [m for m in methods if m.key in wanted]
    stem = Path(args.out) / args.name
    payload: dict[str, Any] = {
        "command": report.command(__file__, sys.argv[1:] if argv is None else argv),
        "settings": {"quick": args.quick, "dataset": args.dataset, "split": args.split,
                     "engine": args.engine, "n": args.n, "rounds": args.rounds,
                     "max_new_tokens": args.max_new_tokens, "seeds": list(range(args.seeds)),
                     "epsilon": EPSILON, "delta": DELTA, "plms": list(PLMS),
                     "max_minutes": args.max_minutes},
        "machine": report.machine(),
        "methods": [{"key": m.key, "label": m.label, "group": m.group, "m": m.m} for m in methods],
        "n_test": len(load_test(data.scored, get_task(data.task))),
        "runs": [], "skipped": [], "finished": False,
    }  # fmt: skip
    settings = Settings(args.engine, args.n, args.rounds, args.max_new_tokens, Path(args.work), args.quick,
                        twins=tuple(grid))  # fmt: skip
    start = time.perf_counter()
    embedder, pool = CachedEmbedder.on_disk(), EnginePool(args.engine)
    try:
        for seed, method in run_order(methods, args):
            elapsed = (time.perf_counter() - start) / 60
            if out_of_time(method, seed, data, settings, elapsed, args.max_minutes):
                payload["skipped"].append((method.key, seed))
                continue
            log.info("== %s seed %d (%.1f min in)", method.key, seed, elapsed)
            record = run_or_fail(method, seed, data, settings, pool, embedder)
            payload["runs"].append(record)
            payload["engine_startup_s"] = dict(pool.startup_s)
            payload["total_s"] = round(time.perf_counter() - start, 1)
            payload["machine"]["load_end"] = report.load_average()
            write_outputs(payload, stem)
    finally:
        pool.close()
    payload["finished"] = True
    payload["machine"]["load_end"] = report.load_average()
    payload["total_s"] = round(time.perf_counter() - start, 1)
    write_outputs(payload, stem)
    log.info("wrote %s.{md,json} in %.1f min", stem, payload["total_s"] / 60)
    print(stem.with_suffix(".md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
