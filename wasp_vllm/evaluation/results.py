"""What an evaluation returns: typed values, and the JSON report ``evaluate`` prints.

``SyntheticScores`` is the report of a synthetic set; its ``operator`` part (FID against the raw
private records, the label agreement of a possibly private reference) is computed outside the DP
accounting and never published: ``published()`` leaves it out, ``to_json()`` keeps it (for the
operator's own ``--out`` file).  ``PrivateOnlyScores`` is the OnlyPrivate baseline, all of it the
operator's.  ``to_json()`` writes the keys in the order the reports always had.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from wasp_vllm.evaluation.classifier import EvalReport
from wasp_vllm.evaluation.common import OPERATOR_NOTE, OPERATOR_ONLY
from wasp_vllm.evaluation.descriptions import DescriptionsScore

#: A JSON object, as the reports are written.
JSON = dict[str, Any]


@dataclass(frozen=True)
class LabelAgreement:
    """Share of synthetic samples whose label a classifier trained on a real reference gives too."""

    overall: float
    per_label: dict[str, float | None]
    n: int
    reference: str
    reference_public: bool

    def to_json(self) -> JSON:
        return {"overall": self.overall, "per_label": self.per_label, "n": self.n,
                "reference": self.reference, "reference_public": self.reference_public}  # fmt: skip


@dataclass(frozen=True)
class OperatorFigures:
    """Figures computed on (possibly) private records outside the accounting: never published."""

    fid: float | None = None
    fid_per_round: dict[int, float] | None = None
    n_private: int | None = None
    label_agreement: LabelAgreement | None = None  # of a reference not declared public

    def to_json(self) -> JSON:
        out: JSON = {"note": OPERATOR_NOTE}
        if self.n_private is not None:
            out |= {"fid": self.fid, "fid_per_round": self.fid_per_round, "n_private": self.n_private}
        if self.label_agreement is not None:
            out["label_agreement"] = self.label_agreement.to_json()
        return out


@dataclass(frozen=True)
class SyntheticCounts:
    """What the synthetic file held (public: the synthetic set is)."""

    n_synthetic: int
    n_rows: int
    n_dropped_null_text: int
    n_dropped_unknown_label: int
    label_balance: dict[str, int]
    per_plm_counts: dict[str, int] | None
    per_round_counts: dict[str, int] | None


class _Scored:
    """A report whose task model's scores are its ``classifier``'s."""

    classifier: EvalReport

    @property
    def accuracy(self) -> float:
        return self.classifier.accuracy

    @property
    def macro_f1(self) -> float:
        return self.classifier.macro_f1

    @property
    def even_mix_macro_f1(self) -> float | None:
        return self.classifier.even_mix_macro_f1


@dataclass(frozen=True)
class SyntheticScores(_Scored):
    """The report of ``evaluate``: a task model trained on the synthetic set, scored on real data."""

    synthetic_path: str
    task: str
    model: str
    embedder: str | None
    reused_stored_embeddings: bool
    seed: int
    counts: SyntheticCounts
    classifier: EvalReport
    fid_method: str
    label_agreement: LabelAgreement | None = None  # of a reference declared public
    operator: OperatorFigures | None = None
    #: The label descriptions alone on the same test set: the reference point beside the scores.
    descriptions: DescriptionsScore | None = None

    def reading(self) -> str | None:
        """One line: the synthetic set's macro-F1 beside the label descriptions' alone."""
        return None if self.descriptions is None else self.descriptions.reading(self.macro_f1)

    def any_label_agreement(self) -> LabelAgreement | None:
        """The label agreement, published or the operator's (for the operator: a benchmark)."""
        if self.label_agreement is not None:
            return self.label_agreement
        return None if self.operator is None else self.operator.label_agreement

    def to_json(self) -> JSON:
        """The whole report, the operator's section included (for the operator's own file)."""
        out: JSON = {"kind": "synthetic", "synthetic_path": self.synthetic_path, "task": self.task,
                     "model": self.model, "embedder": self.embedder,
                     "reused_stored_embeddings": self.reused_stored_embeddings, "seed": self.seed,
                     **vars(self.counts), "accuracy": self.accuracy, "macro_f1": self.macro_f1,
                     "even_mix_macro_f1": self.even_mix_macro_f1, "classifier": self.classifier.to_dict(),
                     "fid_method": self.fid_method}  # fmt: skip
        if self.operator is not None:
            out[OPERATOR_ONLY] = self.operator.to_json()
        if self.label_agreement is not None:
            out["label_agreement"] = self.label_agreement.to_json()
        if self.descriptions is not None:
            out["descriptions_only"] = self.descriptions.to_json()
            out["reading"] = self.reading()
        return out

    def published(self) -> JSON:
        """What may be published: the report without the operator's section."""
        return {k: v for k, v in self.to_json().items() if k != OPERATOR_ONLY}


@dataclass(frozen=True)
class PrivateOnlyScores(_Scored):
    """The OnlyPrivate baseline: the task model trained on the private records (no DP at all)."""

    task: str
    model: str
    embedder: str | None
    seed: int
    n_private: int
    label_balance: dict[str, int]
    classifier: EvalReport

    def to_json(self) -> JSON:
        return {"kind": "only_private", "differentially_private": False, "note": OPERATOR_NOTE,
                "task": self.task, "model": self.model, "embedder": self.embedder, "seed": self.seed,
                "n_private": self.n_private, "label_balance": self.label_balance, "accuracy": self.accuracy,
                "macro_f1": self.macro_f1, "even_mix_macro_f1": self.even_mix_macro_f1,
                "classifier": self.classifier.to_dict()}  # fmt: skip
