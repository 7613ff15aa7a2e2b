"""Hot PATE's demonstration on a real model: coordinated ensembles keep coverage and diversity.

Every teacher sees the same shared list C of numbers plus one private number of its own:

    Here are some numbers: 12, 47, 83, <private>.
    One number picked at random from this list:

SmolLM2's tokenizer writes numbers digit by digit, so a two-digit answer is two tokens.  One
batched forward of all teachers gives the first-token distributions; nine cached decode steps
(the same public digit appended to every teacher, KV caches reused) give the second digit.  The
outcomes are then: every first token that is not a digit 1-9 (as is), each two-digit number, and
"digit then something else".  The ensembles are redrawn many times over these distributions
(fresh shared randomness each time, no model call):

* coverage at threshold T: the share of the n votes in outcomes whose count is >= T (what a
  thresholded private aggregator can return at all), and the part of it on the numbers in C;
* distinct: how many different outcomes clear T over all draws (diversity transferred), and how
  many of the three numbers in C do;
* outside C: how many outcomes other than the numbers in C ever clear T.  A coordinated
  ensemble returns an outcome with probability about the smallest probability the teachers
  give it, so outcomes that *every* teacher finds plausible (other numbers, a space) do come
  out - that is diversity, not leakage - while an outcome backed by one teacher (its private
  number, beyond the background probability the others give it) never gains more than the one
  vote of that teacher.

The paper's finding is that independent ("cold") ensembles lose coverage and diversity as T
grows (the votes spread over the good answers, every count ~ n/r), while coordinated ensembles
keep both up to thresholds near n.  A second table runs the actual noisy aggregators (one
Gaussian release each) at a few noise scales.

Run ``python -m benchmarks.hotpate.hotpate_coverage [--quick]``; writes
``benchmarks/results/hotpate_coverage.md``, ``.json`` and ``.png``.
"""

from __future__ import annotations

import argparse
import logging
import math
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import report
from wasp_vllm.hotpate import (
    HeterogeneousAggregator,
    HomogeneousAggregator,
    PreparedEnsemble,
    TeacherEnsembleLM,
    load_lm,
)
from wasp_vllm.hotpate.ensembles import EnsembleKind
from wasp_vllm.privacy.gaussian import epsilon_for_sigma

log = logging.getLogger("hotpate_coverage")

RESULTS = Path(__file__).resolve().parents[1] / "results"
SHARED = (12, 47, 83)
THRESHOLDS = (0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
KINDS: tuple[EnsembleKind, ...] = ("coordinated", "independent")
PROMPT = "Here are some numbers: {numbers}.\nOne number picked at random from this list: "


@dataclass(frozen=True)
class Row:
    """Coverage statistics of one ensemble kind at one threshold."""

    kind: str
    fraction: float
    threshold: float
    coverage: float
    coverage_c: float
    distinct: int
    distinct_c: int
    outside: int
    per_draw: float


def private_numbers(n: int, rng: np.random.Generator) -> list[int]:
    """One private two-digit number per teacher, not in C (distinct while there are enough)."""
    pool = [x for x in range(10, 100) if x not in SHARED]
    return [int(x) for x in rng.choice(pool, size=n, replace=n > len(pool))]


@dataclass(frozen=True)
class Outcomes:
    """Teachers' distributions over outcomes: every first token that is not a digit 1-9, and,
    after a first digit a, the two-digit numbers a0..a9 and "a then something else"."""

    probs: np.ndarray  # [n_teachers, n_outcomes]
    numbers: dict[int, int]  # outcome column -> two-digit number
    shared: set[int]  # columns of the numbers in C
    private: set[int]  # columns of the teachers' private numbers
    private_by_teacher: tuple[int, ...]  # each teacher's own private number's column
    forward_s: float


def teacher_outcomes(model: str, n: int, rng: np.random.Generator) -> Outcomes:
    """One batched prefill of all teachers, then one cached decode step per first digit."""
    privates = private_numbers(n, rng)
    prompts = [PROMPT.format(numbers=", ".join(map(str, (*SHARED, p)))) for p in privates]
    lm = load_lm(model, device="cpu")
    start = time.perf_counter()
    ens = TeacherEnsembleLM(lm, prompts, chat=False)
    first = ens.next_distributions().astype(np.float64)
    digit = [ens.encode(str(d))[0] for d in range(10)]
    keep = np.setdiff1d(np.arange(first.shape[1]), digit[1:])
    columns, numbers = [first[:, keep]], {}
    for a in range(1, 10):
        ens.reset()
        ens.append(digit[a])  # the same public token for every teacher: KV caches reused
        second = ens.next_distributions().astype(np.float64)
        second_digits = second[:, digit]
        for b in range(10):
            numbers[keep.size + (a - 1) * 11 + b] = 10 * a + b
        other = np.clip(1.0 - second_digits.sum(axis=1, keepdims=True), 0.0, None)
        columns.append(first[:, [digit[a]]] * np.hstack([second_digits, other]))
    seconds = time.perf_counter() - start
    probs = np.hstack(columns)
    probs /= probs.sum(axis=1, keepdims=True)
    col = {v: k for k, v in numbers.items()}
    mine = tuple(col[p] for p in privates)
    return Outcomes(probs, numbers, {col[c] for c in SHARED}, set(mine), mine, seconds)


def draw_histograms(
    probs: np.ndarray, kind: EnsembleKind, draws: int, seed: int
) -> list[tuple[np.ndarray, np.ndarray]]:
    """``draws`` independent draws of the ensemble (sparse histograms)."""
    prepared, rng = PreparedEnsemble(probs, kind), np.random.default_rng(seed)
    out = []
    for _ in range(draws):
        hist = prepared.histogram(rng)
        out.append((hist.tokens, hist.counts))
    return out


def coverage_rows(kind: str, hists: list, n: int, oc: Outcomes) -> list[Row]:
    shared = np.array(sorted(oc.shared))
    rows = []
    for f in THRESHOLDS:
        t = f * n
        covered = covered_c = per_draw = 0.0
        seen: set[int] = set()
        for tokens, counts in hists:
            ok = counts >= t
            covered += counts[ok].sum() / n
            covered_c += counts[ok & np.isin(tokens, shared)].sum() / n
            per_draw += int(ok.sum())
            seen.update(tokens[ok].tolist())
        k = len(hists)
        rows.append(
            Row(kind, f, t, covered / k, covered_c / k, len(seen), len(seen & oc.shared),
                len(seen - oc.shared), per_draw / k)
        )  # fmt: skip
    return rows


@dataclass(frozen=True)
class AggRow:
    """Noisy aggregation at one noise scale: how often a token comes back, and how varied."""

    aggregator: str
    kind: str
    sigma: float
    epsilon_one: float
    threshold: float
    returned: float
    returned_c: float
    distinct: int
    outside: int


def aggregation_rows(oc: Outcomes, draws: int, seed: int) -> list[AggRow]:
    n, vocab = oc.probs.shape
    rows = []
    for sigma in (n / 64, n / 32, n / 16):
        eps = epsilon_for_sigma(sigma, 1e-5, math.sqrt(2), 1)
        for agg in (HomogeneousAggregator(sigma), HeterogeneousAggregator(sigma)):
            for kind in KINDS:
                prepared, rng = PreparedEnsemble(oc.probs, kind), np.random.default_rng(seed)
                got = [agg(prepared.histogram(rng), rng).token for _ in range(draws)]
                tokens = {t for t in got if t is not None}
                in_c = sum(1 for t in got if t in oc.shared) / draws
                rows.append(
                    AggRow(agg.name, kind, sigma, eps, agg.resolve_threshold(n, vocab),
                           1 - got.count(None) / draws, in_c, len(tokens), len(tokens - oc.shared))
                )  # fmt: skip
    return rows


def reference_line(oc: Outcomes) -> str:
    """What the teachers' distributions look like (averaged, so no single teacher shows)."""
    mean = oc.probs.mean(axis=0)
    held = oc.probs[:, list(oc.private_by_teacher)]  # [teacher, whose private number]
    own = float(np.diag(held).mean())
    others = float((held.sum() - np.trace(held)) / max(1, held.size - held.shape[0]))
    numbers = sorted(oc.numbers, key=lambda c: -mean[c])[:6]
    return (
        f"Teachers' average probability of answering a number in C: {mean[sorted(oc.shared)].sum():.3f}; "
        f"of answering its own private number: {own:.3f}; of answering another teacher's private "
        f"number: {others:.4f}; most likely numbers on average: "
        + ", ".join(f"{oc.numbers[c]} ({mean[c]:.3f})" for c in numbers)
        + "."
    )


def coverage_table(rows: list[Row]) -> str:
    by = {(r.kind, r.fraction): r for r in rows}
    lines = [
        "| T / n | T | coverage coord. | coverage indep. | ...on C coord. | ...on C indep. "
        "| distinct coord. | distinct indep. | C numbers coord. | C numbers indep. "
        "| outside C coord. | outside C indep. |",
        "|" + "---|" * 12,
    ]
    for f in THRESHOLDS:
        c, i = by[("coordinated", f)], by[("independent", f)]
        lines.append(
            f"| {f:.2f} | {c.threshold:.1f} | {c.coverage:.3f} | {i.coverage:.3f} | {c.coverage_c:.3f} "
            f"| {i.coverage_c:.3f} | {c.distinct} | {i.distinct} | {c.distinct_c} | {i.distinct_c} "
            f"| {c.outside} | {i.outside} |"
        )
    return "\n".join(lines)


def aggregation_table(rows: list[AggRow]) -> str:
    lines = [
        "| aggregator | ensemble | sigma | eps (one release) | threshold | returned | returned in C "
        "| distinct | outside C |",
        "|" + "---|" * 9,
    ]
    for r in rows:
        lines.append(
            f"| {r.aggregator} | {r.kind} | {r.sigma:.2f} | {r.epsilon_one:.2f} | {r.threshold:.1f} "
            f"| {r.returned:.3f} | {r.returned_c:.3f} | {r.distinct} | {r.outside} |"
        )
    return "\n".join(lines)


def plot(rows: list[Row], path: Path, n: int) -> None:
    plt = report.pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for kind, style, color in zip(KINDS, ("o-", "s--"), ("tab:blue", "tab:orange"), strict=True):
        sub = [r for r in rows if r.kind == kind]
        x = [r.fraction for r in sub]
        axes[0].plot(x, [r.coverage for r in sub], style, color=color, label=f"{kind}: all outcomes")
        axes[0].plot(
            x, [r.coverage_c for r in sub], style, color=color, alpha=0.45, label=f"{kind}: numbers in C"
        )
        axes[1].plot(x, [r.distinct for r in sub], style, color=color, label=kind)
    axes[0].set(xlabel="threshold T / n", ylabel="share of votes in outcomes with count >= T",
                title=f"coverage ({n} teachers)")  # fmt: skip
    axes[1].set(xlabel="threshold T / n", ylabel="distinct outcomes clearing T (all draws)",
                title="diversity", yscale="symlog")  # fmt: skip
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="32 teachers, 300 draws (well under a minute)")
    parser.add_argument("--teachers", type=int, default=None, help="default 64 (32 with --quick)")
    parser.add_argument("--draws", type=int, default=None, help="default 2000 (300 with --quick)")
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--threads", type=int, default=1, help="torch CPU threads (1 is fastest on shared CPUs)"
    )
    parser.add_argument("--out", type=Path, default=RESULTS / "hotpate_coverage")
    args = parser.parse_args(argv)
    meta: dict[str, Any] = {
        "command": report.command(__file__, sys.argv[1:] if argv is None else argv),
        "machine": report.machine(),
    }
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    import torch

    torch.set_num_threads(args.threads)
    n = args.teachers or (32 if args.quick else 64)
    draws = args.draws or (300 if args.quick else 2000)
    agg_draws = max(200, draws // 4)
    t0 = time.perf_counter()
    oc = teacher_outcomes(args.model, n, np.random.default_rng(args.seed))
    t1 = time.perf_counter()
    rows = []
    for k, kind in enumerate(KINDS):
        rows += coverage_rows(kind, draw_histograms(oc.probs, kind, draws, args.seed + 1 + k), n, oc)
    t2 = time.perf_counter()
    agg_rows = aggregation_rows(oc, agg_draws, args.seed + 10)
    t3 = time.perf_counter()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    plot(rows, args.out.with_suffix(".png"), n)
    times = (oc.forward_s, t1 - t0, t2 - t1, t3 - t2, time.perf_counter() - t0)
    meta["machine"]["load_end"] = report.load_average()
    settings = {
        "model": args.model,
        "teachers": n,
        "draws": draws,
        "aggregation_draws": agg_draws,
        "seed": args.seed,
    }
    tables = {"coverage": [asdict(r) for r in rows], "aggregation": [asdict(r) for r in agg_rows]}
    report.write_json(
        args.out.with_suffix(".json"), {**meta, "settings": settings, "timings_s": times, **tables}
    )
    text = render(args, n, draws, agg_draws, oc, rows, agg_rows, times, meta)
    args.out.with_suffix(".md").write_text(text)
    log.info("%s", text)


def render(args: argparse.Namespace, n: int, draws: int, agg_draws: int, oc: Outcomes, rows: list[Row],
           agg_rows: list[AggRow], times: tuple[float, ...], meta: dict) -> str:  # fmt: skip
    forward_s, setup_s, draw_s, agg_s, total_s = times
    prompt = PROMPT.format(numbers=", ".join(map(str, (*SHARED, "P"))))
    return "\n".join(
        [
            *report.header("Hot PATE coverage: coordinated vs independent ensembles", meta),
            f"Model `{args.model}` (transformers, CPU fp32, {args.threads} thread(s)); {n} teachers; "
            f"{draws} draws of the shared randomness per ensemble; seed {args.seed}; "
            f"{oc.probs.shape[1]} outcomes.",
            f"Prompt: `{prompt!r}`, P a private two-digit number per teacher (not in C).",
            "",
            reference_line(oc),
            "",
            "Coverage = mean share of the n votes in outcomes whose count is >= T (...on C: the part on "
            "the numbers of C); distinct = different outcomes clearing T over all draws; C numbers = how "
            "many of the 3 shared numbers ever clear T; outside C = distinct outcomes clearing T that "
            "are not numbers in C.",
            "",
            coverage_table(rows),
            "",
            f"Noisy aggregation, {agg_draws} draws each: Gaussian noise sigma on every outcome, "
            "eps of that one release at delta 1e-5 (sensitivity sqrt 2); default thresholds n/2 + L "
            "(homogeneous) and 2L (heterogeneous), L = sigma * z(1e-3 / outcomes). 'returned' = share "
            "of draws that returned an outcome (the rest would be retried or fall back to the public "
            "prompt).",
            "",
            aggregation_table(agg_rows),
            "",
            f"Timings: all teacher distributions (one batched prefill of {n} prompts + 9 cached decode "
            f"steps) {forward_s:.1f} s; with model loading {setup_s:.1f} s; ensemble draws {draw_s:.1f} s; "
            f"noisy aggregation {agg_s:.1f} s; total {total_s:.1f} s.",
            "",
        ]
    )


if __name__ == "__main__":
    main()
