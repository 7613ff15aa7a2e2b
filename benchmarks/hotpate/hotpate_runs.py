"""Real runs for the Hot PATE yields benchmark: the done command through the CLI, and ``evaluate``.

``run_all`` runs ``wasp-vllm hotpate --n 50 --epsilon 4`` (the packaged data, M = 600) under each
accounting, reads the published manifest, and scores the records with
``evaluate_synthetic(path, EvalSettings(test="drugs", private="drugs", reference="drugs:fit"))``
(accuracy and macro-F1 of a task model trained on them, label agreement, FID against the M
private records - an operator-only figure, fine here because the "private" set is public data).
"""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import report

RUNS = report.REPO / "runs" / "hotpate-bench"
DONE = ("--n", "50", "--epsilon", "4")


def _cli(args: list[str]) -> tuple[float, str]:
    env = os.environ | {"HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONUNBUFFERED": "1"}
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "wasp_vllm", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=3 * 3600,
        cwd=report.REPO,
    )
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr[-3000:])
    return time.perf_counter() - start, proc.stdout


def _evaluate(path: str, m: int, task: str = "drugs") -> dict[str, Any]:
    from wasp_vllm.evaluation import evaluate_synthetic
    from wasp_vllm.evaluation.settings import EvalSettings

    scored = EvalSettings(test=task, task=task, private=task, private_limit=m, reference=f"{task}:fit")
    rep = evaluate_synthetic(path, scored)
    agreement = rep.any_label_agreement()  # the overall share; per label it is in the run's own report
    return {
        "accuracy": rep.accuracy,
        "macro_f1": rep.macro_f1,
        "label_agreement": None if agreement is None else agreement.overall,
        "fid": None if rep.operator is None else rep.operator.fid,
    }


def run_one(accounting: str, m: int) -> dict[str, Any]:
    out = RUNS / f"done-{accounting}"
    args = ["hotpate", *DONE, "--accountant", accounting, "--out", str(out), "--overwrite"]
    seconds, stdout = _cli(args)
    p = json.loads((out / "manifest.json").read_text())["privacy"]
    row = {"command": "wasp-vllm " + " ".join(args[:-3]), "accounting": accounting, "wall_s": round(seconds),
           **_spent(p), "stdout": stdout.strip()[-300:]}  # fmt: skip
    row.update(_evaluate(str(out / "synthetic.parquet"), m))
    return row


def _spent(p: dict[str, Any]) -> dict[str, Any]:
    """What a Hot PATE manifest's privacy block says the run wrote and spent."""
    return {
        "records": p["records_written"],
        "private": p["tokens_private"],
        "fallback": p["tokens_fallback"],
        "share": p["private_token_share"],
        "by_reason": p["tokens_fallback_by_reason"],
        "epsilon": p["guarantee"]["epsilon"],
        "queries": p["plain_composition"]["queries"],
        "plain_epsilon": p["plain_composition"]["epsilon"],
    }


def imported_row(run_dir: Path) -> dict[str, Any]:
    """A Hot PATE run made on another machine (a GPU), scored here.

    ``run_dir`` holds its ``manifest.json`` and ``synthetic.parquet``, and ``device.json`` written by
    whoever ran it: ``command``, ``task``, ``where`` (the machine and engine), ``wall_s``, ``ran``.
    """
    made = json.loads((run_dir / "device.json").read_text())
    p = json.loads((run_dir / "manifest.json").read_text())["privacy"]
    row = {**made, "teachers_per_label": p["teachers_per_label"], **_spent(p)}
    row.update(_evaluate(str(run_dir / "synthetic.parquet"), p["settings"]["requested_m"], made["task"]))
    return row


def merge_imported(previous: Sequence[dict[str, Any]], new: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The saved imported runs, a new one replacing an old one of the same command."""
    commands = {r["command"] for r in new}
    return [*(r for r in previous if r["command"] not in commands), *new]


def run_wasp(m: int) -> dict[str, Any]:
    """WASP beside it: one PLM (SmolLM2), the same M, N = 50, eps = 4, at most 48 new tokens."""
    out = RUNS / "wasp"
    args = ["generate", "--plms", "smollm2", "--task", "drugs", "--m", str(m), "--n", "50", "--rounds", "3",
            "--epsilon", "4", "--max-new-tokens", "48", "--out", str(out), "--overwrite"]  # fmt: skip
    seconds, stdout = _cli(args)
    row = {"command": "wasp-vllm " + " ".join(args[:-3]), "accounting": "WASP (exact Gaussian)",
           "wall_s": round(seconds), "records": None, "private": None, "fallback": None, "share": None,
           "by_reason": {"abstain": "-", "no_release": "-", "budget": "-"}, "epsilon": 4.0, "queries": None,
           "plain_epsilon": None, "stdout": stdout.strip()[-300:]}  # fmt: skip
    manifest = json.loads((out / "manifest.json").read_text())
    row["records"] = manifest.get("output", {}).get("rows")
    row.update(_evaluate(str(out / "synthetic.parquet"), m))
    return row


RUN_NAMES = ("gaussian", "target-charging", "wasp")
RAN_BEFORE_DATES = "before 2026-11-26"  # rows saved before the runs had a date


def run_all(m: int, names: Sequence[str], previous: Sequence[dict[str, Any]] = ()) -> list[dict[str, Any]]:
    """The named runs made now; the others carried from ``previous`` (a saved payload's runs).  Each
    row says the day it ran (``ran``), so a table never passes an old run for a new one."""
    unknown = set(names) - set(RUN_NAMES)
    if unknown:
        raise ValueError(f"unknown runs {sorted(unknown)}: choose from {', '.join(RUN_NAMES)}")
    old = {_name(r): r for r in previous}
    rows = []
    for name in RUN_NAMES:
        if name in names:
            row = run_wasp(m) if name == "wasp" else run_one(name, m)
            rows.append({**row, "ran": datetime.date.today().isoformat()})
        elif name in old:
            rows.append({"ran": RAN_BEFORE_DATES, **old[name]})
    return rows


def _name(row: dict[str, Any]) -> str:
    return "wasp" if row["accounting"].startswith("WASP") else row["accounting"]


def tables(runs: list[dict[str, Any]]) -> list[report.Table]:
    if not runs:
        return []
    return [
        report.Table(
            "Real runs of the done command (packaged data, M = 600, 50 records, <= 48 tokens, eps = 4), "
            "and WASP beside it",
            [
                "command",
                "records written",
                "private / fallback tokens",
                "private share",
                "fallback: abstain / no release / budget",
                "guarantee eps",
                "queries",
                "plain composition eps",
                "accuracy",
                "macro-F1",
                "label agreement",
                "FID",
                "wall s",
                "ran",
            ],
            [
                [
                    r["command"],
                    r["records"],
                    "-" if r["private"] is None else f"{r['private']} / {r['fallback']}",
                    "-" if r["share"] is None else r["share"],
                    _fallback_cell(r),
                    r["epsilon"],
                    "-" if r["queries"] is None else r["queries"],
                    "-" if r["plain_epsilon"] is None else r["plain_epsilon"],
                    r["accuracy"],
                    r["macro_f1"],
                    r["label_agreement"],
                    r["fid"],
                    r["wall_s"],
                    r.get("ran", RAN_BEFORE_DATES),
                ]
                for r in runs
            ],
            [
                "evaluate_synthetic(path, 'drugs', 'drugs', reference='drugs:fit', private_source='drugs', "
                "private_limit=600): logistic regression on all-MiniLM-L6-v2 embeddings, scored on the "
                "test split"
            ],
        )
    ]


def _fallback_cell(row: dict[str, Any]) -> str:
    return "{abstain} / {no_release} / {budget}".format(**row["by_reason"])


def imported_tables(runs: list[dict[str, Any]]) -> list[report.Table]:
    if not runs:
        return []
    header = ["command", "where", "teachers per label", "private / fallback tokens", "private share",
              "fallback: abstain / no release / budget", "guarantee eps", "queries", "accuracy", "macro-F1",
              "label agreement", "FID", "wall s", "ran"]  # fmt: skip
    scores = ("accuracy", "macro_f1", "label_agreement", "fid", "wall_s", "ran")
    rows = [
        [r["command"], r["where"], r["teachers_per_label"], f"{r['private']} / {r['fallback']}", r["share"],
         _fallback_cell(r), r["epsilon"], r["queries"],
         *(r[k] for k in scores)]
        for r in runs
    ]  # fmt: skip
    note = (
        "evaluate_synthetic(path, TASK, TASK, reference='TASK:fit', private_source=TASK, private_limit=M): "
        "the same classifier as above, on TASK's test split; on the GPU the private file was TASK's fit "
        "split written to parquet; scored here with "
        "`python -m benchmarks.hotpate.hotpate_yields --add-run DIR`"
    )
    title = (
        "Real runs at a larger M, made on a GPU (transformers; the coordinated draw on the GPU), scored here"
    )
    return [report.Table(title, header, rows, [note])]


def walk_summary(walks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per label: what the measured ensembles look like (public: the packaged data are public)."""
    out = []
    for w in walks:
        f = np.asarray(w["fractions"], dtype=float)
        out.append(
            {
                "label": w["label"],
                "teachers": w["n_teachers"],
                "empty_teachers": w["empty_teachers"],
                "positions": int(f.shape[0]),
                "mean_top_fraction": float(f.mean()),
                "draws_at_least_0.8": float((f >= 0.8).mean()),
                "draws_unanimous": float((f >= 1.0).mean()),
                "seconds": w["seconds"],
            }
        )
    return out


def notes(payload: dict[str, Any]) -> list[str]:
    """What was measured, per records-per-teacher setting, and the neighbour relation."""
    out = []
    for part in payload["by_k"]:
        by = {(r["epsilon"], r["accounting"][:12]): r["private"] for r in part["yields"]}
        agree = ", ".join(f"{m['label']} {m['mean_top_fraction']:.2f}" for m in part["measured"])
        gauss = "/".join(f"{by[(e, 'after: Gauss')]:.1f}" for e in (1.0, 4.0, 8.0))
        tct = "/".join(f"{by[(e, 'after: targe')]:.1f}" for e in (1.0, 4.0, 8.0))
        out.append(
            f"k = {part['k']} records per teacher ({part['teachers_per_label']} teachers per label at "
            f"M = {payload['settings']['m']}): {part['positions']} token positions measured "
            f"({part['draws_per_position']} coordinated draws each, {part.get('measure_s') or 0:.0f} s); "
            f"mean top-count fraction per label: {agree}; private tokens at eps 1/4/8: Gaussian per label "
            f"{gauss}, target charging {tct}."
        )
    out.append(
        "Defaults taken from these tables: the Gaussian accounting (target charging's cap is 0 hits at this "
        "M for every eps <= 8, so it makes no call), 1 record per teacher (three times the teachers of "
        "k = 3 at the same M, so about nine times the releases, at a similar agreement on the two frequent "
        "labels), threshold fraction 0.9 (the best f at M = 600 for eps 4 and 8; at eps 1 every f "
        "gives 0 to 2 private tokens).  The rare label (neutral, "
        "54 of 600 records) leaves most of its teachers empty: their agreement is the public prompt's."
    )
    out.append(
        "Neighbours are replace (the CLI always draws --m): the Gaussian ledgers use sensitivity 2 sqrt 2 "
        "(two teachers of one ensemble may each move a vote; 2 before issue 21), target charging "
        "(eps/2, delta/2) per label at 2 votes.  delta = 1e-5."
    )
    return out
