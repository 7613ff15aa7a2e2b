"""How much of WASP's PLM re-weighting is signal, and how much is the DP noise.

After each vote WASP gives every PLM a share of the next round in proportion to the mean noisy
near-vote its samples got.  This reads finished runs of a benchmark's work folder
(``WORK/TASK/METHOD_sSEED/``: the operator's files, fine in a benchmark on public data sets, never
published) and, per round that voted, puts that mean against the noise on it:

* ``c``: a PLM's samples the vote ranked (all written so far; the round's own under
  ``voted_samples='newest'``), ``S``: the sum of their noisy near-votes, ``S / c`` their mean;
  the Gaussian noise on that mean has std ``sigma / sqrt(c)``, and both ``sigma`` and ``c`` are
  public;
* with two PLMs, ``z = (S_a/c_a - S_b/c_b) / (sigma * sqrt(1/c_a + 1/c_b))``: the gap between their
  means in units of the noise on that gap.  Noise alone gives |z| > 2 in about one vote of twenty;
* ``signal_share = 1 - sigma^2 / var(noisy near-votes)``: the share of the votes' spread over the
  samples that is not the noise (the noise is independent of the votes, so the variances add).
  Near 0, the top-S pools are drawn by the noise; an estimate from n samples moves by about
  ``sqrt(2/n)``, so it can fall below 0.

The benchmarks fix the noise per seed (``--noise-seed 10000 + seed``), so runs of one seed on
different tasks draw the same noise.  Where the weights follow the noise rather than the samples,
those runs take the same weight path whatever the task: the table shows it side by side.

    python benchmarks/plm_weight_noise.py --work runs/bench-val --name plm_weight_noise
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import report
from round_stats import voted_samples


def vote_rounds(run_dir: Path, manifest: dict[str, Any]) -> list[dict[str, Any]]:
    """Per round that voted: each PLM's sample count and noisy vote sum, the z of the first two PLMs'
    gap, and the weights the run took from that vote."""
    rounds_dir = run_dir / "private" / "rounds"
    plms = list(manifest["config"]["plms"])
    sigma = manifest["privacy"]["ledger"]["sigmas"][-1]  # the votes' sigma (the first may be the prior's)
    tables, out = [], []
    for record in manifest["rounds"]:
        t = record["round"]
        tables.append(pq.read_table(rounds_dir / f"round-{t:03d}.parquet", columns=["id", "plm"]))
        voted = voted_samples(run_dir, tables, t)
        if voted is None:
            continue  # the last round does not vote
        synth, votes = voted
        near = votes.column("h_near").to_numpy()
        plm_of = np.asarray(synth.column("plm").to_pylist())
        counts = [int((plm_of == p).sum()) for p in plms]
        sums = [float(near[plm_of == p].sum()) for p in plms]
        z = None
        if len(plms) == 2 and min(counts) > 0:
            gap = sums[0] / counts[0] - sums[1] / counts[1]
            z = gap / (sigma * np.sqrt(1 / counts[0] + 1 / counts[1]))
        weights = record["weights_after"]
        spread = float(near.var(ddof=1)) if near.size > 1 else 0.0
        signal = 1.0 - sigma**2 / spread if spread > 0 else None
        out.append({"round": t, "counts": counts, "vote_sums": sums, "z": z, "weights": weights,
                    "sigma": sigma, "signal_share": signal})  # fmt: skip
    return out


def collect(work: Path, methods: list[str], n: int | None) -> list[dict[str, Any]]:
    """Every finished run of ``methods`` (of size ``n``, if given) under ``work``, with its votes."""
    runs = []
    for path in sorted(work.glob("*/*_s*/manifest.json")):
        run_dir = path.parent
        method, seed = run_dir.name.rsplit("_s", 1)
        manifest = json.loads(path.read_text())
        if method not in methods or (n is not None and manifest["config"]["n"] != n):
            continue
        config = manifest["config"]
        runs.append({"task": run_dir.parent.name, "method": method, "seed": int(seed), "plms": config["plms"],
                     "n": config["n"], "rounds": vote_rounds(run_dir, manifest)})  # fmt: skip
    return runs


def same_path(runs: list[dict[str, Any]]) -> dict[str, float | None]:
    """Per method and seed (``"METHOD seed S"``): the mean correlation, over pairs of tasks, of their
    z paths (1: the same path)."""
    out: dict[str, float | None] = {}
    for method, seed in sorted({(r["method"], r["seed"]) for r in runs}):
        mine = [r for r in runs if r["method"] == method and r["seed"] == seed]
        paths = [[x["z"] for x in r["rounds"]] for r in mine]
        paths = [p for p in paths if None not in p and len(p) > 1 and np.std(p) > 0]
        pairs = [np.corrcoef(a, b)[0, 1] for i, a in enumerate(paths) for b in paths[i + 1 :]]
        out[f"{method} seed {seed}"] = float(np.mean(pairs)) if pairs else None
    return out


def tables(payload: dict[str, Any]) -> list[report.Table]:
    runs = payload["runs"]
    width = max((len(r["rounds"]) for r in runs), default=0)
    rows = []
    for r in sorted(runs, key=lambda r: (r["seed"], r["method"], r["task"])):
        first = r["plms"][0]
        cells = [f"{x['z']:+.1f} ({x['weights'][0]:.2f})" if x["z"] is not None else "-" for x in r["rounds"]]
        rows.append([r["seed"], r["task"], r["method"], first, *cells, *["-"] * (width - len(cells))])
    per_run = report.Table(
        "z of the gap between the two PLMs' mean noisy vote per sample (in brackets: the first PLM's share "
        "after the vote)",
        ["seed", "task", "method", "first PLM", *(f"vote {t}" for t in range(width))], rows,
        ["z > 0: the first PLM's samples got more votes per sample; the noise alone gives |z| < 2 "
         "19 times in 20.", "Runs of one seed share their noise draws, whatever the task."],
    )  # fmt: skip
    signal = report.Table(
        "How much of the noisy near-votes is signal (mean over the runs of a method)",
        ["method", "runs", "sigma", *(f"vote {t}" for t in range(width))],
        signal_rows(runs, width),
        ["1 - sigma^2 / variance of the noisy near-votes over the samples voted on: 0 means the top-S "
         "pools are drawn by the noise.", "A vote covers all samples written so far, so the same vote "
         "mass spreads over more samples each round; under voted_samples='newest' (wasp-vote-newest) "
         "it covers the round's own 60."],
    )  # fmt: skip
    corr = report.Table(
        "Do runs of one seed take the same path on different tasks?",
        ["method and seed", "mean correlation of the z paths over pairs of tasks"],
        [[key, value if value is not None else "-"] for key, value in payload["same_path"].items()],
        ["Near 1: the weights follow the noise (shared by seed), not the samples (which differ by task)."],
    )  # fmt: skip
    return [per_run, signal, corr]


def signal_rows(runs: list[dict[str, Any]], width: int) -> list[list[Any]]:
    rows = []
    for method in sorted({r["method"] for r in runs}):
        mine = [r for r in runs if r["method"] == method]
        cells = []
        for t in range(width):
            shares = [r["rounds"][t]["signal_share"] for r in mine if len(r["rounds"]) > t]
            shares = [s for s in shares if s is not None]
            cells.append(f"{np.mean(shares):.2f}" if shares else "-")
        sigmas = sorted({round(x["sigma"], 2) for r in mine for x in r["rounds"]})
        rows.append([method, len(mine), ", ".join(f"{s:g}" for s in sigmas), *cells])
    return rows


def plot(payload: dict[str, Any], path: Path) -> None:
    plt = report.pyplot()
    seeds = sorted({r["seed"] for r in payload["runs"]})
    fig, axes = plt.subplots(1, max(len(seeds), 1), figsize=(4.5 * max(len(seeds), 1), 3.5), squeeze=False)
    for ax, seed in zip(axes[0], seeds, strict=False):
        for r in (r for r in payload["runs"] if r["seed"] == seed):
            points = [(x["round"], x["z"]) for x in r["rounds"] if x["z"] is not None]
            ax.plot(*zip(*points, strict=True), marker="o", label=f"{r['task']} ({r['method']})")
        ax.set_xticks(sorted({x["round"] for r in payload["runs"] for x in r["rounds"]}))
        ax.axhspan(-2, 2, color="0.9", zorder=0)
        ax.set(title=f"seed {seed}", xlabel="vote after round", ylabel="z (first PLM − second)")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = report.work_parser(__doc__, "plm_weight_noise")
    p.add_argument("--methods", default="wasp", help="comma list of the runs' method names (default wasp)")
    p.add_argument("--n", type=int, default=None, help="only runs of this N (default: all)")
    args, payload = report.start_on_work(__file__, p, argv)
    payload["runs"] = collect(args.work, args.methods.split(","), args.n)
    if not payload["runs"]:
        p.error(f"no finished runs of {args.methods} under {args.work}")
    payload["same_path"] = same_path(payload["runs"])
    report.write_all(args.out, args.name, "PLM weights against the DP noise", report.finish(payload),
                     tables(payload), plot)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
