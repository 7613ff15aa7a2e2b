"""Re-labelling a sample that reads as another label, against rejecting it (issue 59, item 5).

Today the label check (``--label-check drop``) rejects a sample whose embedding is nearer another
label's description than its own, and asks for it again: about 2.3 samples are written for every
one kept. Re-labelling would keep it under the label it reads as (public: the sample, the task's
label descriptions and the embedder; no privacy cost). This measures both on the same samples:

* per task and seed, one round of zero-shot prompts to every PLM with the label check off (FuseGen's
  first round: the product's other checks still drop empty samples, copies and prompt echoes);
* the run's own label check, read offline, splits the kept samples into on-label and off-label;
* *reject* keeps the on-label ones; *relabel* keeps all, an off-label one under the label it reads
  as; *as written* keeps all under the label they were asked for (the label check off); *relabel
  beyond M* (one per ``--margins`` value) relabels only an off-label sample that trails the label it
  reads as by more than M, and rejects the nearer misses: the curve between reject and relabel;
  the *reader* ways ask a second reader, the nearest centroid of the run's own on-label samples
  (public: it reads only the samples and the label check): *reader relabel* keeps every off-label
  sample under the reader's label, *reader seconds* only those where the reader names the asked
  label or the one the check reads, *reader vets* as well rejects an on-label sample the reader
  reads as another label;
* for each: kept / generated (generated = every sample written, the other checks' rejects
  included), label agreement against a classifier trained on ``TASK:fit`` (as the tasks grid's),
  and the largest label's share of what is kept (re-labelling may pile samples onto one label);
* on the same samples, how far routing could go: each PLM keeps its even share of the round but
  writes the labels it writes on-label most often (``routing``), against today's even split.

Zero-shot samples only: WASP's few-shot rounds may miss their label at another rate. The choosing
group's tasks only (docs/suite.md): this chooses, so the held-out group is refused. FuseGen does
not vote: no private record decides anything here.

    python -m benchmarks.quality.relabel                      # choosing group, 2 seeds, N = 90
    python -m benchmarks.quality.relabel --tasks trec --seeds 1 --n 24
    python -m benchmarks.quality.relabel --plms qwen,llama3 --name relabel_gpu   # larger PLMs (a GPU)

A finished run folder of the same settings is read back, not written again (a new ``--margins`` on
the same samples costs no generation).
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import report
from benchmarks.quality.harness import (
    AUTO_ENGINE,
    PLMS,
    REPO,
    CachedEmbedder,
    Data,
    EnginePool,
    Method,
    Settings,
    manifest_rejects,
    run_config,
    setup_logging,
)
from benchmarks.quality.policies import unit_rows
from benchmarks.quality.round_stats import ReferenceJudge
from benchmarks.quality.seed_stats import fmt, fmt_diff, paired_diff
from wasp_vllm.data.suite import SUITE

#: The ways every run reports; ``--margins`` adds one ``relabel beyond M`` each.
WAYS = ("reject", "relabel", "as_written")
FIGURES = ("kept_share", "label_agreement", "largest_label_share")


def zero_shot_round(plms: Sequence[str]) -> Method:
    """One zero-shot round of the PLMs, every sample kept that the product's other checks pass."""
    return Method("fusegen-label-check-off", "zero-shot, label check off", "lever",
                  {"strategy": "fusegen", "plms": list(plms), "label_check": "off"})  # fmt: skip


def run_folder(work: Path, task: str, seed: int, plms: Sequence[str]) -> Path:
    """Where a round is written: the packaged PLMs' as they always were, other PLMs' apart (a run of
    other settings in a folder is written again, so one set's rounds must not sit in another's)."""
    tag = "" if tuple(plms) == PLMS else "-" + "+".join(plms)
    return work / task / f"relabel{tag}_s{seed}"


def outcomes(asked: np.ndarray, leads: np.ndarray, reads_as: np.ndarray, judged: np.ndarray,
             generated: int, n_labels: int, margins: Sequence[float] = (),
             reader: np.ndarray | None = None) -> dict[str, dict[str, float | None]]:  # fmt: skip
    """Each way's kept / generated, label agreement and largest label share, from the label each
    sample was asked for (``asked``), the label check's lead of its own label (``leads``, negative:
    off-label) and the label it reads as (``reads_as``), and the reference classifier's label.
    ``reader``: the label the run's own on-label samples read each sample
    as (``read_by_own_samples``), which adds the three ``reader`` ways."""
    on = leads >= 0
    relabelled = np.where(on, asked, reads_as)
    everything = np.ones_like(on)
    kept = {"reject": (on, asked), "relabel": (everything, relabelled), "as_written": (everything, asked)}
    kept |= {beyond(m): (on | (leads < -m), relabelled) for m in margins}
    if reader is not None:
        reader = np.where(reader < 0, relabelled, reader)  # where it cannot read, the check's label
        # a second reader's word: where it names the asked label or the one the check reads
        seconded = (reader == asked) | (reader == reads_as)
        kept |= {"reader relabel": (everything, np.where(on, asked, reader)),
                 "reader seconds": (on | seconded, np.where(on, asked, reader)),
                 "reader vets": (seconded & ((reader == asked) | ~on), reader)}  # fmt: skip
    out: dict[str, dict[str, float | None]] = {}
    for way, (mask, labels) in kept.items():
        n = int(mask.sum())
        counts = np.bincount(labels[mask], minlength=n_labels)
        out[way] = {
            "kept_share": n / generated if generated else None,
            "label_agreement": float(np.mean(judged[mask] == labels[mask])) if n else None,
            "largest_label_share": float(counts.max() / n) if n else None,
        }
    return out


def read_by_own_samples(
    embeddings: np.ndarray, asked: np.ndarray, on: np.ndarray, n_labels: int
) -> np.ndarray:
    """The label each sample reads as by the run's own on-label samples: the label whose centroid
    of on-label samples (unit embeddings, under the label they were asked for) is nearest by
    cosine. Public: a function of the samples and the label check alone. An on-label sample is
    read without itself in its label's centroid (leave-one-out), so no sample vouches for itself.
    -1 where fewer than two labels have a centroid to read against.

    Nearest centroid, not a trained classifier: a round holds tens of on-label samples in 768
    dimensions, where a fitted model learns the noise (a logistic regression on 24 well-separated
    synthetic points in 30 dimensions misread a quarter of them out of fold)."""
    unit = unit_rows(embeddings)
    onehot = np.eye(n_labels)[asked] * on[:, None]  # [n, labels]: an on-label sample's own label
    sums, counts = onehot.T @ unit, onehot.sum(axis=0)  # [labels, dim], [labels]
    # per sample, each label's centroid less the sample itself where it is in it
    own_sums = sums[None, :, :] - onehot[:, :, None] * unit[:, None, :]
    own_counts = counts[None, :] - onehot
    norms = np.linalg.norm(own_sums, axis=2)
    cosine = np.einsum("nld,nd->nl", own_sums, unit) / np.maximum(norms, 1e-12)
    cosine[own_counts == 0] = -np.inf  # no centroid: an empty label
    read = cosine.argmax(axis=1)
    return np.where((own_counts > 0).sum(axis=1) >= 2, read, -1)


def beyond(margin: float) -> str:
    """The way that relabels only off-label samples trailing by more than ``margin``."""
    return f"relabel beyond {margin:g}"


def ways_of(run: dict) -> list[str]:
    """The ways a measured run holds (``outcomes``' keys), in their order."""
    return [k for k, v in run.items() if isinstance(v, dict)]


def write_round(run: Callable[[], Any], out: Path) -> dict:
    """The run's manifest: a finished run of the same settings in ``out`` is read back, anything
    else there is replaced."""
    from wasp_vllm.config import ConfigError

    try:
        return run().execute(resume=True).to_json()
    except ConfigError as exc:  # other settings (another --n, say): write it again
        logging.getLogger(__name__).info("%s: %s; writing it again", out, exc)
        return run().execute(overwrite=True).to_json()


def measure(task: str, seed: int, args: argparse.Namespace, pool: Any, embedder: Any, judge: Any) -> dict:
    """One zero-shot round on ``task``, then every way's figures on its samples."""
    import pyarrow.parquet as pq

    from wasp_vllm.pipeline import Run, prepare
    from wasp_vllm.pipeline.label_check import LabelCheck
    from wasp_vllm.tasks import get_task

    spec = get_task(task)
    settings = Settings(args.engine, args.n, 1, None, args.work / task)
    out, method = run_folder(args.work, task, seed, args.plms), zero_shot_round(args.plms)
    start = time.perf_counter()
    manifest = write_round(lambda: Run(prepare(run_config(method, seed, Data(task, "validation"), settings)),
                                       out, engine_factory=pool, embedder=embedder), out)  # fmt: skip
    written = pq.read_table(out / "synthetic.parquet", columns=["text", "label", "plm"])
    texts, labels = written.column("text").to_pylist(), written.column("label").to_pylist()
    asked = np.array([spec.labels.index(x) for x in labels])
    check = LabelCheck(spec, embedder)
    embeddings = np.asarray(embedder.encode(texts), dtype=np.float32)
    generated = len(texts) + sum(manifest_rejects(manifest).values())
    leads = check.leads(embeddings, labels)
    reader = read_by_own_samples(embeddings, asked, leads >= 0, len(spec.labels))
    judged = judge.predict(task, texts)
    found = outcomes(asked, leads, check.scores(embeddings).argmax(axis=1), judged,
                     generated, len(spec.labels), args.margins, reader)  # fmt: skip
    plms, on = written.column("plm").to_pylist(), leads >= 0
    flags = {"written": np.ones_like(on), "on": on, "agreed": on & (judged == asked)}
    cells = {f"plm_label_{k}": plm_label_counts(plms, asked, f, len(spec.labels), args.plms)
             for k, f in flags.items()}  # fmt: skip
    return {"task": task, "seed": seed, "generated": generated, "written": len(texts),
            "seconds": round(time.perf_counter() - start, 1), **cells, **found}  # fmt: skip


def plm_label_counts(plms: Sequence[str], asked: np.ndarray, flags: np.ndarray, n_labels: int,
                     order: Sequence[str] = PLMS) -> list[list[int]]:  # fmt: skip
    """Per PLM (in ``order``) and asked label: how many of its samples are flagged."""
    counts = np.zeros((len(order), n_labels), int)
    rows = np.array([list(order).index(p) for p in plms], dtype=int)
    np.add.at(counts, (rows, asked), flags.astype(int))
    return counts.tolist()


def best_routing(rates: np.ndarray) -> np.ndarray:
    """The shares x[plm, label] of a round's samples that maximise the on-label share
    sum(x * rates), where each PLM keeps an even share (rows sum to 1 / PLMs) and each label gets
    an even split (columns sum to 1 / labels): which PLM writes which label, given how often each
    wrote each label on-label (public: the label check reads only the samples)."""
    from scipy.optimize import linprog

    n_plms, n_labels = rates.shape
    rows = np.kron(np.eye(n_plms), np.ones(n_labels))  # one equation per PLM
    cols = np.kron(np.ones(n_plms), np.eye(n_labels))  # one per label
    found = linprog(-rates.ravel(), A_eq=np.vstack([rows, cols]), bounds=(0, None),
                    b_eq=np.r_[np.full(n_plms, 1 / n_plms), np.full(n_labels, 1 / n_labels)])  # fmt: skip
    return found.x.reshape(rates.shape)


def routed_figures(shares: np.ndarray, on: np.ndarray, agreed: np.ndarray) -> tuple[float, float]:
    """The on-label share of the samples under ``shares`` (per PLM and label, as ``best_routing``)
    and the reference classifier's agreement with the on-label ones, from each cell's rates."""
    on_label = float((shares * on).sum())
    return on_label, float((shares * agreed).sum()) / max(on_label, 1e-12)


def routing(runs: list[dict]) -> dict[str, dict[str, float]]:
    """Per task, mean over seeds: the on-label share of the written samples under today's even
    split of every label over the PLMs, under the routing that is best for the same samples
    (in-sample: an upper bound), and under the routing chosen on another seed's samples (what a
    run could do with its previous round's rates); for the last, also the label agreement of the
    on-label samples (``agreement, routed by another seed``; today's: ``agreement, even``).
    Routing changes only which PLM writes which label, so each PLM-label cell's samples stand for
    its share: the figures are those cells' rates weighted by the routing."""
    out: dict[str, dict[str, float]] = {}
    for task in dict.fromkeys(r["task"] for r in runs):
        mine = [r for r in runs if r["task"] == task and "plm_label_on" in r]
        if not mine:
            continue
        written = [np.maximum(r["plm_label_written"], 1) for r in mine]
        cells = [(np.divide(r["plm_label_on"], n), np.divide(r["plm_label_agreed"], n))
                 for r, n in zip(mine, written, strict=True)]  # fmt: skip
        even = [routed_figures(np.full(on.shape, 1 / on.size), on, agreed) for on, agreed in cells]
        inside = [routed_figures(best_routing(on), on, agreed)[0] for on, agreed in cells]
        row = {"even": statistics.fmean(f[0] for f in even),
               "agreement, even": statistics.fmean(f[1] for f in even),
               "routed, same samples": statistics.fmean(inside)}  # fmt: skip
        if len(cells) > 1:  # route by each other seed's rates, score on this one
            across = [routed_figures(best_routing(other), on, agreed) for i, (on, agreed) in enumerate(cells)
                      for j, (other, _) in enumerate(cells) if i != j]  # fmt: skip
            row["routed by another seed"] = statistics.fmean(f[0] for f in across)
            row["agreement, routed by another seed"] = statistics.fmean(f[1] for f in across)
        out[task] = row
    if out:
        ways = next(iter(out.values())).keys()
        out["mean over tasks"] = {w: statistics.fmean(r[w] for r in out.values() if w in r) for w in ways}
    return out


def summary(runs: list[dict]) -> dict[str, dict[str, Any]]:
    """Per task: each way's figures over seeds, and relabel − reject paired by seed."""
    out: dict[str, dict[str, Any]] = {}
    for task in dict.fromkeys(r["task"] for r in runs):
        mine = [r for r in runs if r["task"] == task]
        row: dict[str, Any] = {"group": SUITE.get(task, "-"), "seeds": [r["seed"] for r in mine]}
        ways = ways_of(mine[0])
        for way in ways:
            row[way] = {k: [r[way][k] for r in mine] for k in mine[0][way]}
        by_seed = {way: {k: {r["seed"]: r[way][k] for r in mine} for k in mine[0][way]} for way in ways}
        for way in (w for w in ways if w not in ("reject", "as_written")):  # each relabelling way
            row[f"{way} − reject"] = {
                k: paired_diff(by_seed[way][k], by_seed["reject"][k])
                for k in ("kept_share", "label_agreement")
            }
        out[task] = row
    return out


def overall(per_task: dict[str, dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Each way's figures, the mean over tasks of each task's mean over seeds."""

    def mean(way: str, k: str) -> float:
        return statistics.fmean(
            statistics.fmean(v for v in r[way][k] if v is not None) for r in per_task.values()
        )

    ways = [w for w in next(iter(per_task.values())) if " − " not in w and w not in ("group", "seeds")]
    return {way: {k: mean(way, k) for k in FIGURES} for way in ways}


def tables(payload: dict[str, Any]) -> list[report.Table]:
    names = {"reject": "reject (today)", "relabel": "relabel", "as_written": "as written (check off)"}
    rows = []
    for task, row in payload["tasks"].items():
        for way in (w for w in row if w not in ("group", "seeds")):
            if " − " in way:
                diff = row[way]
                rows.append([f"{task} ({row['group']})", f"{way} (paired)", fmt_diff(diff["kept_share"]),
                             fmt_diff(diff["label_agreement"]), "-"])  # fmt: skip
            else:
                figures = (fmt(row[way][k], 3) for k in FIGURES)
                rows.append([f"{task} ({row['group']})", names.get(way, way), *figures])
    for way, figures in payload["overall"].items():
        rows.append(["mean over tasks", names.get(way, way), *(f"{figures[k]:.3f}" for k in FIGURES)])
    notes = ["kept / generated: samples kept over every sample written (the other checks' rejects "
             "included); label agreement: against a classifier trained on TASK:fit; largest label: "
             "the largest label's share of what is kept (asked: an even split). Mean ± std over seeds.",
             "relabel beyond M: an off-label sample that trails the label it reads as by more than M "
             "(cosine to the label descriptions) is relabelled, a nearer miss is rejected.",
             "reader: the nearest centroid of the run's own on-label samples (leave-one-out); reader "
             "relabel: every off-label sample under its label; reader seconds: only where it names "
             "the asked label or the check's; reader vets: also rejects on-label ones it reads otherwise.",
             "The goal (issue 59): kept / generated ≥ 0.7 without losing label agreement."]  # fmt: skip
    columns = ["task (group)", "way", "kept / generated", "label agreement", "largest label share"]
    found = [report.Table("Reject or relabel an off-label sample (one zero-shot round, every PLM)", columns,
                          rows, notes)]  # fmt: skip
    if routed := payload.get("routing"):
        ways = list(routed["mean over tasks"])
        found.append(report.Table(
            "Which PLM writes which label: the on-label share of the written samples, and their agreement",
            ["task", *ways],
            [[task, *(f"{row[w]:.3f}" if w in row else "-" for w in ways)] for task, row in routed.items()],
            ["even: every label split evenly over the PLMs (today); routed: each PLM keeps an even share "
             "of the round but writes the labels it wrote on-label most often (a linear programme), "
             "chosen on the same samples (an upper bound) or on another seed's. On-label: the label "
             "check's verdict; kept / generated is about this share times written / generated. "
             "Agreement: of the on-label samples with the reference classifier, each PLM-label cell "
             "weighted by its routed share."]))  # fmt: skip
    return found


def plot(payload: dict[str, Any], path: Path) -> None:
    """Per task, kept / generated against label agreement for each way (mean over seeds), and the
    mean over tasks from reject through each margin to relabel."""
    plt = report.pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 5.2))
    for way, marker in zip(WAYS, ("o", "s", "^"), strict=True):
        xs = [statistics.fmean(r[way]["kept_share"]) for r in payload["tasks"].values()]
        ys = [statistics.fmean(r[way]["label_agreement"]) for r in payload["tasks"].values()]
        ax.scatter(xs, ys, marker=marker, label=way.replace("_", " "))
        for task, x, y in zip(payload["tasks"], xs, ys, strict=True):
            ax.annotate(task, (x, y), fontsize=6, alpha=0.7)
    curve = sorted((f["kept_share"], f["label_agreement"], w) for w, f in payload["overall"].items()
                   if w in ("reject", "relabel") or w.startswith("relabel beyond"))  # fmt: skip
    ax.plot([c[0] for c in curve], [c[1] for c in curve], "k.-",
            label="mean over tasks: reject → margins → relabel")  # fmt: skip
    for x, y, way in curve:
        ax.annotate(way.removeprefix("relabel beyond "), (x, y), fontsize=6)
    for way, f in payload["overall"].items():
        if way.startswith("reader"):  # the second reader's ways: off the check's own curve
            ax.plot(f["kept_share"], f["label_agreement"], "r*", markersize=9)
            ax.annotate(way, (f["kept_share"], f["label_agreement"]), fontsize=7, color="red")
    ax.axvline(0.7, color="grey", linestyle=":", label="goal: kept / generated 0.7")
    ax.set_xlabel("kept / generated")
    ax.set_ylabel("label agreement")
    ax.set_title("Reject or relabel an off-label sample, per task")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=2)  # below: off the points
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def margin_list(text: str) -> tuple[float, ...]:
    """``--margins``: non-negative numbers, comma-separated."""
    try:
        margins = tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma list of numbers: {text!r}") from None
    if any(not 0 <= m < 2 for m in margins):  # a cosine lead lies in (-2, 2)
        raise argparse.ArgumentTypeError(f"margins lie in [0, 2): {text!r}")
    return margins


def plm_list(text: str) -> tuple[str, ...]:
    """``--plms``: PLM names, comma-separated, each once."""
    plms = tuple(x.strip() for x in text.split(",") if x.strip())
    if not plms or len(set(plms)) != len(plms):
        raise argparse.ArgumentTypeError(f"one or more PLMs, each once: {text!r}")
    return plms


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    choosing = [t for t, g in SUITE.items() if g == "choosing"]
    p.add_argument("--tasks", default=",".join(choosing), help="comma list (default: the choosing group)")
    p.add_argument("--seeds", type=int, default=2)
    p.add_argument("--n", type=int, default=90, help="samples per task and seed (one round, every PLM)")
    p.add_argument("--plms", type=plm_list, default=PLMS,
                   help="comma list of PLM presets (default: the packaged two; others, e.g. on a GPU: "
                        "give --name too, so the committed result stays)")  # fmt: skip
    p.add_argument("--engine", choices=("vllm", "hf"), default=AUTO_ENGINE)
    p.add_argument("--work", type=Path, default=REPO / "runs" / "bench-relabel")
    p.add_argument("--out", type=Path, default=report.RESULTS)
    p.add_argument("--name", default="relabel")
    p.add_argument("--margins", type=margin_list, default=(0.01, 0.02, 0.03, 0.05, 0.08),
                   help="comma list of margins of the 'relabel beyond M' ways ('' for none)")  # fmt: skip
    args = p.parse_args(argv)
    tasks = args.tasks.split(",")
    if unknown := [t for t in tasks if t not in SUITE]:
        raise SystemExit(f"--tasks: not in the suite: {', '.join(unknown)} (one of {', '.join(SUITE)})")
    if held := [t for t in tasks if SUITE[t] == "held-out"]:
        raise SystemExit(
            f"--tasks: {', '.join(held)} belong to the held-out group; choose on the choosing group"
        )
    setup_logging()
    settings = {"tasks": tasks, "seeds": args.seeds, "n": args.n, "engine": args.engine,
                "plms": list(args.plms)}  # fmt: skip
    payload = report.start(__file__, sys.argv[1:] if argv is None else argv, settings)
    embedder, pool = CachedEmbedder.on_disk(), EnginePool(args.engine)
    judge = ReferenceJudge(embedder)
    try:
        payload["runs"] = [
            measure(t, s, args, pool, embedder, judge) for s in range(args.seeds) for t in tasks
        ]
    finally:
        pool.close()
        embedder.flush()
    payload["tasks"] = summary(payload["runs"])
    payload["overall"] = overall(payload["tasks"])
    payload["routing"] = routing(payload["runs"])
    title = "Re-labelling against rejecting an off-label sample"
    report.write_all(args.out, args.name, title, report.finish(payload), tables(payload), plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
