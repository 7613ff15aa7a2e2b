"""Do the in-context examples read as their label?  And would the label check's lead pick better ones?

WASP's few-shot prompts after round 0 show each label's samples that the noisy votes ranked best.
This reads finished runs of a benchmark's work folder (``WORK/TASK/METHOD_sSEED/``: the operator's
files, fine in a benchmark on public data sets, never published) and measures, per task:

* **lead bins**: every sample's *lead* (its own label description's cosine minus the best other
  label's, as ``--label-check`` computes it; public) against the verdict of a reference classifier
  trained on ``TASK:fit`` (as the benchmarks' label agreement): the share of samples whose label the
  classifier gives too, per bin of the lead.  Rising with the lead: the lead, which a run can
  compute, tells which samples carry their label;
* **examples**: the good pools each vote chose, replayed from the run's votes file, and the share
  of their samples the classifier agrees with; then the same replay under ``--pool-label-filter F``
  for several F (the votes choose among the share 1 - F of each label's samples with the largest
  lead).  Round 0's zero-shot samples are the yardstick.

    python benchmarks/example_fidelity.py --work runs/bench-val --method wasp-gate-off
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import report
from round_stats import ReferenceJudge, pool_label_filter_of, pools_per_round, round_tables

#: Upper edges of the lead bins (the last is open).
LEAD_EDGES = (0.0, 0.02, 0.05, 0.1)
SHARES = (0.0, 0.25, 0.5, 0.75)


def _bin_label(i: int) -> str:
    lo = "-inf" if i == 0 else f"{LEAD_EDGES[i - 1]:g}"
    return f"({lo}, {LEAD_EDGES[i]:g}]" if i < len(LEAD_EDGES) else f"> {LEAD_EDGES[-1]:g}"


def lead_bins(leads: np.ndarray, agrees: np.ndarray) -> list[dict[str, Any]]:
    """Per bin of the lead: samples, their share of all, and the share the classifier agrees with."""
    which = np.searchsorted(np.asarray(LEAD_EDGES), leads, side="left")
    out = []
    for i in range(len(LEAD_EDGES) + 1):
        mine = which == i
        share = float(mine.mean()) if leads.size else 0.0
        agreement = float(agrees[mine].mean()) if mine.any() else None
        out.append({"bin": _bin_label(i), "n": int(mine.sum()), "share": share, "agreement": agreement})
    return out


def one_run(run_dir: Path, task: Any, judge: Any) -> dict[str, Any]:
    """Leads and verdicts of a run's samples, and its replayed examples' agreement per filter share
    (``judge``: a ``ReferenceJudge``, or anything with its ``embedder`` and ``predict``)."""
    from wasp_vllm.pipeline.label_check import LabelCheck

    manifest = json.loads((run_dir / "manifest.json").read_text())
    tables = round_tables(run_dir)
    labels = list(task.labels)
    reader = LabelCheck(task, judge.embedder)
    leads, agrees, first_round = [], [], []
    predicted: dict[str, int] = {}  # the classifier's label of every sample: the pools are samples
    for t, table in enumerate(tables):
        texts, lab = table.column("text").to_pylist(), table.column("label").to_pylist()
        guesses = judge.predict(task.name, texts)
        predicted.update(zip(texts, guesses.tolist(), strict=True))
        verdict = guesses == np.array([labels.index(x) for x in lab])
        leads.append(reader.leads(np.asarray(judge.embedder.encode(texts)), lab))
        agrees.append(verdict)
        if t == 0:
            first_round = verdict.tolist()
    examples = {}
    for share in SHARES:
        eligible_of = pool_label_filter_of(task, {"pool_label_filter": share}, judge.embedder)
        pools = pools_per_round(run_dir, tables, labels, int(manifest["config"]["s"]), eligible_of)
        examples[str(share)] = [
            predicted[text] == labels.index(label)
            for by_label in pools.values()
            for label, (good, _) in by_label.items()
            for text in good
        ]
    return {"leads": np.concatenate(leads).tolist(), "agrees": np.concatenate(agrees).tolist(),
            "round0": first_round, "examples": examples}  # fmt: skip


def _agreement(verdicts: list[bool]) -> dict[str, Any]:
    return {"n": len(verdicts), "agreement": float(np.mean(verdicts)) if verdicts else None}


def per_task(work: Path, method: str, tasks: list[str], judge: ReferenceJudge) -> dict[str, Any]:
    from wasp_vllm.tasks import get_task

    out = {}
    for name in tasks:
        runs = sorted((work / name).glob(f"{method}_s*/manifest.json"))
        if not runs:
            continue
        task = get_task(name)
        found = [one_run(path.parent, task, judge) for path in runs]
        leads = np.array([x for r in found for x in r["leads"]])
        agrees = np.array([x for r in found for x in r["agrees"]], dtype=bool)
        round0 = [x for r in found for x in r["round0"]]
        examples = {s: [x for r in found for x in r["examples"][s]] for s in found[0]["examples"]}
        out[name] = {
            "runs": len(found),
            "bins": lead_bins(leads, agrees),
            "round0_agreement": float(np.mean(round0)) if round0 else None,
            "examples": {s: _agreement(v) for s, v in examples.items()},
        }
    return out


def _cell(one_bin: dict[str, Any]) -> str:
    return "-" if one_bin["agreement"] is None else f"{one_bin['agreement']:.2f} ({one_bin['n']})"


def tables(payload: dict[str, Any]) -> list[report.Table]:
    tasks = payload["tasks"]
    bins = report.Table(
        "Reference-classifier agreement by the label check's lead (all samples of the runs)",
        ["task", "runs", *(_bin_label(i) for i in range(len(LEAD_EDGES) + 1))],
        [[name, t["runs"], *(_cell(b) for b in t["bins"])] for name, t in tasks.items()],
        ["In brackets: samples in the bin. The label check (margin 0) keeps only leads > 0."],
    )
    shares = list(next(iter(tasks.values()))["examples"]) if tasks else []
    examples = report.Table(
        "Agreement of the examples the votes chose (replayed), by --pool-label-filter share",
        ["task", "round 0 (zero-shot samples)", *(f"F = {s}" for s in shares)],
        [[name, t["round0_agreement"], *(t["examples"][s]["agreement"] for s in shares)]
         for name, t in tasks.items()],
        ["F = 0.0: the examples the runs showed; F > 0: what the filter would have shown on the same votes "
         "(the later rounds' samples would differ, so this is the first step of the effect only)."],
    )  # fmt: skip
    return [bins, examples]


def plot(payload: dict[str, Any], path: Path) -> None:
    plt = report.pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for name, t in payload["tasks"].items():
        points = [(i, b["agreement"]) for i, b in enumerate(t["bins"]) if b["agreement"] is not None]
        ax.plot(*zip(*points, strict=True), marker="o", label=name)
    ax.set_xticks(range(len(LEAD_EDGES) + 1), [_bin_label(i) for i in range(len(LEAD_EDGES) + 1)], fontsize=7)
    ax.set(xlabel="lead of the sample's own label description", ylabel="reference-classifier agreement")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = report.work_parser(__doc__, "example_fidelity")
    p.add_argument("--method", default="wasp-gate-off", help="the runs' folder name (default wasp-gate-off)")
    p.add_argument("--tasks", default="rotten_tomatoes,tweets,trec,drugs", help="comma list of tasks")
    args, payload = report.start_on_work(__file__, p, argv)
    from harness import CachedEmbedder

    judge = ReferenceJudge(CachedEmbedder.on_disk())
    payload["tasks"] = per_task(args.work, args.method, args.tasks.split(","), judge)
    if not payload["tasks"]:
        p.error(f"no finished runs of {args.method} under {args.work}")
    report.write_all(args.out, args.name, "In-context examples against their labels", report.finish(payload),
                     tables(payload), plot)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
