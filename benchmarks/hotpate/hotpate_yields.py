"""Hot PATE yields per epsilon on the packaged drug reviews: the old accounting against the new.

What a privacy budget buys: private tokens (from the teachers' ensemble rather than the public
fallback) in a run of 50 records of at most 48 tokens at M = 600 (``--m 600``, so replace
neighbours), for epsilon in {1, 4, 8}, under

* before (the generator before issue 17): one Gaussian ledger over all labels, sigma calibrated for
  one release per planned token, the run stopped when the ledger refused;
* Gaussian (after): one ledger per label ensemble (disjoint teachers), sigma from the threshold
  fraction ``f`` (threshold ``n/2 + L = f n``), the fallback takes over when the budget is spent;
* target charging (after): accounting.py's stable argmax and TCT accountant, per label.

A full run at M = 600 takes about an hour of this 2-core CPU per configuration (two seconds per
decode step of 68 cached prompts), so the figures come from a *sample of token positions*:
``hotpate_measure`` walks real records with the real teachers (``k`` records per teacher) and keeps,
per position, the top vote counts of 16 coordinated draws; ``hotpate_simulate`` replays them
under the real accountants.  The same replay, with the measured agreement fractions, extrapolates
to more teachers: the M at which most tokens could be private.  ``--runs`` makes real CLI runs of
the done command (and ``evaluate`` on their records); runs not named are kept from the last result.

Run ``python -m benchmarks.hotpate.hotpate_yields [--measure] [--runs gaussian,target-charging,wasp]``; writes
``benchmarks/results/hotpate_yields.{md,json,png}`` (the walks are cached in ``runs/``).
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Any

from benchmarks import report
from benchmarks.hotpate import hotpate_runs
from benchmarks.hotpate.hotpate_simulate import Scenario, grid_up_to, mean_outcome, teachers_needed

log = logging.getLogger("hotpate_yields")
EPSILONS = (1.0, 4.0, 8.0)
FRACTIONS = (0.6, 0.7, 0.8, 0.9, 1.0)
DEFAULT_FRACTION = 0.9
ACCOUNTINGS = ("gaussian", "target-charging")
TITLE = "Hot PATE yields per epsilon: old accounting against new"
WALKS = report.REPO / "runs" / "hotpate-bench" / "walks_k{k}.json"
LARGE_N = 900  # teachers per label where the Gaussian ledger gets near a majority of private tokens


def yields_rows(walks: list[dict[str, Any]], n: int, seeds: int) -> list[dict[str, Any]]:
    """Private tokens per epsilon at the measured size, before and after."""
    kinds = (
        ("before: one Gaussian ledger, stop when spent", "old-gaussian"),
        (f"after: Gaussian ledger per label, f = {DEFAULT_FRACTION}", "gaussian"),
        (f"after: target charging, f = {DEFAULT_FRACTION}", "target-charging"),
    )
    rows = []
    for eps in EPSILONS:
        for label, acc in kinds:
            out = mean_outcome(walks, Scenario(acc, eps, n, DEFAULT_FRACTION), seeds)
            rows.append({"epsilon": eps, "accounting": label, **out})
    return rows


def sweep_rows(walks: list[dict[str, Any]], sizes: tuple[int, ...], seeds: int) -> list[dict[str, Any]]:
    """Private share by threshold fraction (the public knob that sets the noise), at a few sizes."""
    return [
        {"accounting": acc, "epsilon": eps, "fraction": f, "n": n,
         **mean_outcome(walks, Scenario(acc, eps, n, f), seeds)}
        for n in sizes for acc in ACCOUNTINGS for eps in EPSILONS for f in FRACTIONS
    ]  # fmt: skip


def needed_rows(walks: list[dict[str, Any]], k: int, limit: int) -> list[dict[str, Any]]:
    """Teachers per label (and M = 3 k n) for a private share of at least 1/2, per epsilon."""
    grid, rows = grid_up_to(limit), []
    for acc in ACCOUNTINGS:
        for eps in EPSILONS:
            best: tuple[int, float] | None = None
            for f in FRACTIONS:
                n = teachers_needed(walks, Scenario(acc, eps, 67, f), grid)
                if n is not None and (best is None or n < best[0]):
                    best = (n, f)
            n_best, f_best = best if best is not None else (None, None)
            m = 3 * k * n_best if n_best is not None else None
            rows.append({"accounting": acc, "epsilon": eps, "teachers_per_label": n_best, "fraction": f_best,
                         "m": m, "k": k})  # fmt: skip
    return rows


def curve(walks: list[dict[str, Any]], k: int, limit: int) -> list[dict[str, Any]]:
    """Private share against M (at the default fraction), for the plot."""
    return [
        {"accounting": acc, "epsilon": eps, "m": 3 * k * n, "k": k,
         "share": mean_outcome(walks, Scenario(acc, eps, n, DEFAULT_FRACTION), seeds=1)["share"]}
        for acc in ACCOUNTINGS for eps in EPSILONS for n in grid_up_to(limit)
    ]  # fmt: skip


def one_k(k: int, m: int, limit: int, seeds: int) -> dict[str, Any]:
    """Everything measured and replayed for ``k`` records per teacher."""
    measured = report.read_json(Path(str(WALKS).format(k=k)))
    walks, n = measured["walks"], measured["teachers_per_label"]
    return {
        "k": k, "teachers_per_label": n, "positions": sum(len(w["fractions"]) for w in walks),
        "draws_per_position": measured["draws"], "measure_s": sum(w.get("seconds", 0.0) for w in walks),
        "measured": hotpate_runs.walk_summary(walks), "yields": yields_rows(walks, n, seeds),
        "sweep": sweep_rows(walks, (n, LARGE_N), seeds), "needed": needed_rows(walks, k, limit),
        "curve": curve(walks, k, limit),
    }  # fmt: skip


def plot(payload: dict[str, Any], path: Path) -> None:
    plt = report.pyplot()
    ks = payload["by_k"]
    fig, axes = plt.subplots(1, len(ks), figsize=(6.2 * len(ks), 4.2), squeeze=False)
    colours = {1.0: "tab:red", 4.0: "tab:blue", 8.0: "tab:green"}
    for ax, part in zip(axes[0], ks, strict=True):
        for acc, style in (("gaussian", "o-"), ("target-charging", "s--")):
            for eps in EPSILONS:
                pts = [r for r in part["curve"] if r["accounting"] == acc and r["epsilon"] == eps]
                ax.plot([r["m"] for r in pts], [r["share"] for r in pts], style, color=colours[eps],
                        label=f"{acc}, eps={eps:g}", markersize=3)  # fmt: skip
        ax.axvline(payload["settings"]["m"], color="grey", lw=0.8)
        ax.axhline(0.5, color="grey", lw=0.8, ls=":")
        ax.set(xscale="log", xlabel=f"M (private records; {part['k']} per teacher, 3 labels)",
               ylabel="share of tokens from the private ensemble",
               title=f"{part['k']} records per teacher: 50 records x <= 48 tokens")  # fmt: skip
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _k_tables(part: dict[str, Any], s: dict[str, Any]) -> list[report.Table]:
    k, n = part["k"], part["teachers_per_label"]
    t1 = report.Table(
        f"k = {k}: yields at M = {s['m']} ({n} teachers per label), {s['records']} records",
        ["epsilon", "accounting", "private tokens", "token decisions", "private share", "records written",
         "private calls"],
        [[r["epsilon"], r["accounting"], r["private"], r["tokens"], r["share"], r["records_written"],
          r["calls"]] for r in part["yields"]],
        ["mean of the replays over seeds; token decisions include each record's end decision"],
    )  # fmt: skip
    sweep = part["sweep"]
    t2 = report.Table(
        f"k = {k}: private share by threshold fraction f (threshold = f n)",
        ["teachers per label", "accounting", "epsilon", *[f"f = {f}" for f in FRACTIONS]],
        [[size, acc, eps, *[r["share"] for r in sweep
                            if r["n"] == size and r["accounting"] == acc and r["epsilon"] == eps]]
         for size in sorted({r["n"] for r in sweep}) for acc in ACCOUNTINGS for eps in EPSILONS],
    )  # fmt: skip
    t3 = report.Table(
        f"k = {k}: teachers per label, and M, for most tokens (>= 1/2) to come from the private ensemble",
        ["accounting", "epsilon", "teachers per label", "best f", f"M ({k} per teacher)"],
        [[r["accounting"], r["epsilon"], r["teachers_per_label"] or f"> {s['limit']}", r["fraction"] or "-",
          r["m"] or f"> {3 * k * s['limit']}"] for r in part["needed"]],
        ["extrapolated from the measured agreement fractions (grid of teachers per label, about x1.25 a "
         "step; see hotpate_simulate's docstring)"],
    )  # fmt: skip
    return [t1, t2, t3]


def tables(payload: dict[str, Any]) -> list[report.Table]:
    out = [t for part in payload["by_k"] for t in _k_tables(part, payload["settings"])]
    runs, imported = payload.get("runs", []), payload.get("imported_runs", [])
    return [*out, *hotpate_runs.tables(runs), *hotpate_runs.imported_tables(imported)]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--m", type=int, default=600)
    p.add_argument("--k", default="1,3", help="records per teacher, comma-separated (the default first)")
    p.add_argument("--records", type=int, default=2, help="records walked per label (measurement)")
    p.add_argument("--measure", action="store_true", help="walk the real teachers again (~15 min per k)")
    runs = ",".join(hotpate_runs.RUN_NAMES)
    p.add_argument(
        "--runs",
        default="",
        help=f"real CLI runs to make now, comma-separated from {runs} "
        "(~18 min each); the others are kept from the JSON in --out",
    )
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--limit", type=int, default=12000, help="largest teachers per label extrapolated")
    p.add_argument("--out", type=Path, default=report.RESULTS)
    p.add_argument("--from-json", type=Path, default=None, help="only re-render a saved JSON")
    p.add_argument(
        "--add-run", type=Path, action="append", default=[],
        help="a run made on another machine (folder with manifest.json, synthetic.parquet, device.json): "
        "scored here and added to the saved JSON in --out, which is re-rendered (repeatable)",
    )  # fmt: skip
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    if args.from_json is not None or args.add_run:
        saved = report.read_json(args.from_json or args.out / "hotpate_yields.json")
        if args.add_run:
            new = [hotpate_runs.imported_row(d) for d in args.add_run]
            saved["imported_runs"] = hotpate_runs.merge_imported(saved.get("imported_runs", []), new)
        report.write_all(args.out, "hotpate_yields", TITLE, saved, tables(saved), plot)
        return
    ks = [int(x) for x in args.k.split(",")]
    settings = {"m": args.m, "k": ks, "records": 50, "max_tokens": 48, "limit": args.limit,
                "neighbour": "replace", "delta": 1e-5, "default_fraction": DEFAULT_FRACTION}  # fmt: skip
    payload = report.start(__file__, sys.argv[1:] if argv is None else argv, settings)
    for k in ks:
        path = Path(str(WALKS).format(k=k))
        if args.measure or not path.exists():
            from benchmarks.hotpate import hotpate_measure

            report.write_json(path, hotpate_measure.measure("smollm2", args.m, k, args.records, 16, 48, 0))
    payload["by_k"] = [one_k(k, args.m, args.limit, args.seeds) for k in ks]
    saved = args.out / "hotpate_yields.json"
    previous = report.read_json(saved).get("runs", []) if saved.exists() else []
    payload["runs"] = hotpate_runs.run_all(args.m, [r for r in args.runs.split(",") if r], previous)
    payload["notes"] = hotpate_runs.notes(payload)
    report.write_all(args.out, "hotpate_yields", TITLE, report.finish(payload), tables(payload), plot)


if __name__ == "__main__":
    main()
