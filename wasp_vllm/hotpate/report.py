"""The published report of a Hot PATE run: the guarantee, what plain composition would have charged,
and where every token came from.

Everything here is a setting, a public constant or a function of the private calls' outputs (how
many calls each label made, which were charged, which tokens came from the ensemble): no record
count, no per-label fact about the private records, no hash of them.

The run's guarantee combines the labels' accountants as :func:`~wasp_vllm.hotpate.steps.label_budget`
says: under add/remove the largest label's epsilon (parallel composition); under replace the
Gaussian ledgers are calibrated at sensitivity 2 sqrt 2, so again the largest label's epsilon, while
target charging adds the two largest labels' (eps, delta) (basic composition).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from wasp_vllm.hotpate.bounds import THEOREM, plain_composition_epsilon
from wasp_vllm.hotpate.selector import SOURCES
from wasp_vllm.hotpate.settings import HotPateSettings
from wasp_vllm.hotpate.steps import ChargedStep, GaussianStep, LabelBudget, PrivateStep
from wasp_vllm.pipeline.store import write_json, write_parquet
from wasp_vllm.privacy.gaussian import epsilon_for_sigma


@dataclass
class LabelRun:
    """One label's ensemble: its quota, its private step (and accountant), when its budget ran out."""

    label: str
    quota: int
    step: PrivateStep
    budget_spent_at: int | None = None  # records of the label written before it ran out


@dataclass
class Tally:
    """Counters of the run (public: functions of the calls' outputs).

    A record's tokens are its token decisions, the final end-of-sequence decision included; the
    decisions of records that came out empty (and were generated again) are counted apart.
    """

    rows: list[dict[str, Any]] = field(default_factory=list)
    per_record: list[list[int]] = field(default_factory=list)
    tokens: dict[str, int] = field(default_factory=lambda: dict.fromkeys(SOURCES, 0))
    empty: int = 0
    empty_decisions: int = 0
    labels: list[LabelRun] = field(default_factory=list)

    def add_tokens(self, sources: dict[str, int]) -> None:
        for key, value in sources.items():
            self.tokens[key] += value

    def add_record(self, row: dict[str, Any], private: int, fallback: int) -> None:
        self.rows.append(row)
        self.per_record.append([private, fallback])


def _label_epsilon(step: PrivateStep) -> tuple[float, str]:
    """The epsilon one label's accountant guarantees (its cap's bound), and how."""
    if isinstance(step, GaussianStep) and step.ledger is not None:
        cap, ledger, sigma = step.cap() or 0, step.ledger, step.aggregator.sigma
        eps = epsilon_for_sigma(sigma, ledger.delta, step.sensitivity, cap) if cap else 0.0
        how = (
            f"at most {cap} Gaussian releases of the vote histogram (sigma {sigma:.4g}, L2 sensitivity "
            f"{step.sensitivity:.4g}), composed exactly (Gaussian DP, analytic Gaussian mechanism)"
        )
        return eps, how
    if isinstance(step, ChargedStep) and step.accountant is not None:
        acc = step.accountant
        how = f"{THEOREM}; cap {acc.max_hits} charged calls of at most {acc.max_calls} calls"
        return acc.epsilon_guaranteed(), how
    raise ValueError("a step without an accountant has no guarantee")


def _combine(values: list[float], s: HotPateSettings) -> float:
    """Labels to the run: the largest, or the two largest added (target charging under replace)."""
    if not values:
        return 0.0
    if s.neighbour == "replace" and s.accounting == "target-charging":
        top = sorted(values, reverse=True)[:2]
        return float(sum(top))
    return float(max(values))


def guarantee(s: HotPateSettings, budget: LabelBudget, labels: list[LabelRun]) -> dict[str, Any]:
    """The run's ``(epsilon, delta)`` and the statement behind it."""
    per_label = [_label_epsilon(lr.step) for lr in labels]
    eps = _combine([e for e, _ in per_label], s)
    delta = (
        2 * budget.delta if (s.neighbour == "replace" and s.accounting == "target-charging") else budget.delta
    )
    how = per_label[0][1] if per_label else "no private call"
    neighbours = "replace (an --m draw: one record more or less in the file swaps at most one)"
    relation = neighbours if s.neighbour == "replace" else "add/remove one record"
    return {
        "epsilon": eps,
        "delta": min(delta, s.delta),
        "neighbour": s.neighbour,
        "statement": (
            f"({eps:.4g}, {min(delta, s.delta):.3g})-DP with respect to the private file ({relation}). "
            f"Each label's ensemble: {how}, within ({budget.epsilon:.4g}, {budget.delta:.3g}). "
            f"Over labels: {budget.composition}."
        ),
        "per_label_budget": {"epsilon": budget.epsilon, "delta": budget.delta},
        "per_label_epsilon": {lr.label: e for lr, (e, _) in zip(labels, per_label, strict=True)},
    }


def plain_composition(s: HotPateSettings, budget: LabelBudget, labels: list[LabelRun]) -> dict[str, Any]:
    """What composing every query of this very run would have charged (the pay-per-query bound)."""
    per_label = {}
    for lr in labels:
        step = lr.step
        if isinstance(step, GaussianStep) and step.ledger is not None:
            per_label[lr.label] = step.ledger.spent_epsilon()
        elif isinstance(step, ChargedStep):
            m = step.mechanism
            per_label[lr.label] = plain_composition_epsilon(
                step.calls, m.eps_step, budget.delta, m.delta_per_call
            )
    queries = sum(lr.step.calls for lr in labels)
    return {
        "queries": queries,
        "queries_per_label": {lr.label: lr.step.calls for lr in labels},
        "epsilon": _combine(list(per_label.values()), s),
        "epsilon_per_label": per_label,
        "how": "every query composed: Gaussian DP for the Gaussian releases; for target charging, "
        "advanced composition of the same number of eps_step-DP calls (accounting.composition_epsilon)",
    }


@dataclass(frozen=True)
class HotPateReport:
    """What a Hot PATE run spent and where its tokens came from; :meth:`to_json` is the manifest's
    ``privacy`` entry.  ``guarantee`` and ``plain_composition`` are the accountings' own statements,
    ``labels`` each label ensemble's calls and caps, ``tokens_per_record`` ``[private, fallback]``."""

    accounting: str
    guarantee: dict[str, Any]
    epsilon: float
    delta: float
    plain_composition: dict[str, Any]
    teachers_per_label: int
    settings: dict[str, Any]
    labels: dict[str, dict[str, Any]]
    tokens_private: int
    tokens_fallback_by_reason: dict[str, int]
    tokens_per_record: list[list[int]]
    records_requested: int
    records_written: int
    records_empty_regenerated: int
    token_decisions_in_empty_records: int
    budget_exhausted: bool
    #: The teachers' engine ("hf", "vllm"; "custom" for a caller's own source).
    engine: str = "custom"

    @property
    def tokens_fallback(self) -> int:
        return sum(self.tokens_fallback_by_reason.values())

    @property
    def private_token_share(self) -> float:
        tokens = self.tokens_private + self.tokens_fallback
        return self.tokens_private / tokens if tokens else 0.0

    @property
    def epsilon_guaranteed(self) -> float:
        return float(self.guarantee["epsilon"])

    def to_json(self) -> dict[str, Any]:
        return {
            "mechanism": "hot_pate",
            "accounting": self.accounting,
            "guarantee": self.guarantee,
            "epsilon": self.epsilon,
            "delta": self.delta,
            "epsilon_guaranteed": self.epsilon_guaranteed,
            "plain_composition": self.plain_composition,
            "teachers_per_label": self.teachers_per_label,
            "settings": self.settings,
            "labels": self.labels,
            "tokens_private": self.tokens_private,
            "tokens_fallback": self.tokens_fallback,
            "tokens_fallback_by_reason": self.tokens_fallback_by_reason,
            "private_token_share": self.private_token_share,
            "tokens_per_record": self.tokens_per_record,
            "records_requested": self.records_requested,
            "records_written": self.records_written,
            "records_empty_regenerated": self.records_empty_regenerated,
            "token_decisions_in_empty_records": self.token_decisions_in_empty_records,
            "budget_exhausted": self.budget_exhausted,
            "engine": self.engine,
        }


def run_report(s: HotPateSettings, n_teachers: int, tally: Tally) -> HotPateReport:
    """The manifest entry: settings, guarantee, the plain-composition comparison and the token split."""
    budget = s.budget()
    labels = {
        lr.label: {**lr.step.report(), "records": lr.quota, "budget_spent_at_record": lr.budget_spent_at}
        for lr in tally.labels
    }
    return HotPateReport(
        accounting=s.accounting,
        guarantee=guarantee(s, budget, tally.labels),
        epsilon=s.epsilon,
        delta=s.delta,
        plain_composition=plain_composition(s, budget, tally.labels),
        teachers_per_label=n_teachers,
        settings=s.public(),
        labels=labels,
        tokens_private=tally.tokens["private"],
        tokens_fallback_by_reason={k: v for k, v in tally.tokens.items() if k != "private"},
        tokens_per_record=tally.per_record,
        records_requested=s.n_samples,
        records_written=len(tally.rows),
        records_empty_regenerated=tally.empty,
        token_decisions_in_empty_records=tally.empty_decisions,
        budget_exhausted=any(lr.budget_spent_at is not None for lr in tally.labels),
    )


def manifest_entry(report: HotPateReport, requested_m: int | None) -> dict[str, Any]:
    """The run's ``manifest.json``: method, accounting, the privacy report and the public M."""
    return {"method": "hotpate", "accounting": report.accounting, "privacy": report.to_json(),
            "private_data": {"requested_m": requested_m}}  # fmt: skip


def summary_line(report: HotPateReport, out: str) -> str:
    """What the CLI prints at its default level (public)."""
    delta = report.guarantee.get("delta", report.delta)
    return (
        f"wrote {report.records_written} records to {out}; {report.private_token_share:.0%} of their tokens "
        f"from the private ensemble; ({report.epsilon_guaranteed:.4g}, {delta:.3g})-DP ({report.accounting})"
    )


def publish(out: Path, table: pa.Table, report: HotPateReport, requested_m: int | None) -> str:
    """Write the run's published files and return the line the CLI prints.

    Published: settings and functions of the calls' outputs only (no count or hash of the records).
    """
    write_parquet(out / "synthetic.parquet", table)
    write_json(out / "manifest.json", manifest_entry(report, requested_m))
    return summary_line(report, str(out))
