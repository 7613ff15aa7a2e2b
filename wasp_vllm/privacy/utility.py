"""The utility check's release read: each task model's macro-F1 and accuracy on the private records,
and the synthetic set's lead over the zero-shot reference and the label descriptions, with
intervals that cover the DP noise and the sampling error (the release itself is
:meth:`wasp_vllm.privacy.mechanisms.VotingMechanism.release_confusions`).

Post-processing only: the input is the released matrices (one count per private record in each,
plus Gaussian noise of a public sigma) and public settings, so everything here may be published.

The intervals cover both errors of the figure as an estimate of the task model's score on the
population the records come from (what a test split measures): the DP noise and the sampling error
of M records.  They come from a parametric bootstrap: records are drawn again from the (clipped)
noisy matrix, as many as it counts, noised again with the same sigma, and scored; the basic
bootstrap interval (twice the estimate less the replicates' quantiles) then corrects the bias that
clipping the noise gives small cells.  The difference of two sets is bootstrapped as if their
matrices were independent: the records are the same, so the true covariance is positive and the
interval is wider than it need be, never narrower.

Why scoring on the records that voted is sound: the synthetic set depends on them only through
noisy votes, so a task model trained on it cannot fit them much better than fresh records from the
same population (the guarantee bounds how much any one record moves the set).  The optimism that
remains is measured on the suite (``benchmarks/utility_check.py``: score on the private records
less score on the test split).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np

#: Bootstrap replicates per interval, and its confidence.
REPLICATES, CONFIDENCE = 2000, 0.95
#: The sets the check scores, in the order of the released matrices.
CHECKED_SETS = ("synthetic", "zero-shot reference", "label descriptions")


@dataclass(frozen=True)
class Interval:
    """An estimate and its ``CONFIDENCE`` interval."""

    estimate: float
    low: float
    high: float

    def __str__(self) -> str:
        return f"{self.estimate:.3f} [{self.low:.3f}, {self.high:.3f}]"


@dataclass(frozen=True)
class CheckedSet:
    """One task model's scores on the private records."""

    name: str
    macro_f1: Interval
    accuracy: Interval


@dataclass(frozen=True)
class UtilityFigures:
    """What the check publishes: the noisy matrices, each set's scores, the lead, and a reading."""

    #: The released matrices, one per set of :data:`CHECKED_SETS` (rows: true label; columns: predicted).
    noisy_confusions: list[list[list[float]]]
    sigma: float
    sets: list[CheckedSet]
    #: The synthetic set's macro-F1 less the zero-shot reference's.
    lead_over_zero_shot: Interval
    #: The synthetic set's macro-F1 less the label descriptions' (nearest description, no data).
    lead_over_descriptions: Interval
    confidence: float = CONFIDENCE
    #: The set the run published as synthetic.parquet: the whole synthetic set, or (``publish_better``
    #: and :attr:`zero_shot_better`) the zero-shot reference, round 0's samples alone.
    published: str = CHECKED_SETS[0]

    def reading(self) -> str:
        """One line a data owner reads first."""
        lines = [_verdict(self.lead_over_zero_shot, "round 0's zero-shot samples alone (no private data)")]
        lines.append(_verdict(self.lead_over_descriptions, "the label descriptions alone"))
        if self.published != CHECKED_SETS[0]:
            lines.append("so synthetic.parquet holds round 0's zero-shot samples alone (--publish-better)")
        return "; ".join(lines)

    def publishing_the_better(self) -> UtilityFigures:
        """These figures, with the zero-shot reference published where it is better beyond the
        interval (a decision from the noisy matrices alone: post-processing, no privacy cost)."""
        return replace(self, published=CHECKED_SETS[1]) if self.zero_shot_better else self

    def to_json(self) -> dict[str, Any]:
        return asdict(self) | {"reading": self.reading()}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> UtilityFigures:
        def interval(value: Mapping[str, float]) -> Interval:
            return Interval(value["estimate"], value["low"], value["high"])

        sets = [CheckedSet(s["name"], interval(s["macro_f1"]), interval(s["accuracy"])) for s in data["sets"]]
        return cls(
            data["noisy_confusions"], data["sigma"], sets, interval(data["lead_over_zero_shot"]),
            interval(data["lead_over_descriptions"]), data["confidence"],
            data.get("published", CHECKED_SETS[0]),
        )  # fmt: skip

    @property
    def zero_shot_better(self) -> bool:
        """Whether the zero-shot reference is better beyond the interval."""
        return self.lead_over_zero_shot.high < 0


def _verdict(lead: Interval, other: str) -> str:
    if lead.high < 0:
        return f"below {other} ({lead}): the synthetic set adds nothing here"
    if lead.low > 0:
        return f"above {other} ({lead})"
    return f"level with {other} within the interval ({lead})"


def macro_f1(confusion: np.ndarray) -> float:
    """Macro-F1 of a confusion matrix (rows true, columns predicted), over the labels it holds."""
    tp = np.diag(confusion)
    support, predicted = confusion.sum(axis=1), confusion.sum(axis=0)
    present = (support > 0) | (predicted > 0)
    denominator = support + predicted
    f1 = np.divide(2 * tp, denominator, out=np.zeros_like(tp, dtype=float), where=denominator > 0)
    return float(f1[present].mean()) if present.any() else 0.0


def accuracy(confusion: np.ndarray) -> float:
    total = confusion.sum()
    return float(np.trace(confusion) / total) if total > 0 else 0.0


def figures(noisy: np.ndarray, sigma: float, seed: int = 0) -> UtilityFigures:
    """The published figures from the released ``[sets, K, K]`` matrices (``seed``: public)."""
    noisy = np.asarray(noisy, dtype=float)
    rng = np.random.default_rng([seed, 73])
    replicates = [_replicates(matrix, sigma, rng) for matrix in noisy]
    sets = []
    for name, matrix, (f1s, accs) in zip(CHECKED_SETS, noisy, replicates, strict=True):
        clipped = np.clip(matrix, 0, None)
        sets.append(CheckedSet(name, _basic(macro_f1(clipped), f1s), _basic(accuracy(clipped), accs)))
    over_zero_shot, over_descriptions = (
        _basic(sets[0].macro_f1.estimate - sets[k].macro_f1.estimate, replicates[0][0] - replicates[k][0])
        for k in (1, 2)
    )
    return UtilityFigures(noisy.round(3).tolist(), sigma, sets, over_zero_shot, over_descriptions)


def _replicates(noisy: np.ndarray, sigma: float, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Macro-F1 and accuracy of matrices drawn again: as many records as the noisy matrix counts,
    from its clipped shares, noised again."""
    clipped = np.clip(noisy, 0, None)
    records = max(int(round(noisy.sum())), 1)
    shares = clipped.ravel() / clipped.sum() if clipped.sum() > 0 else np.full(clipped.size, 1 / clipped.size)
    counts = rng.multinomial(records, shares, size=REPLICATES).reshape(REPLICATES, *noisy.shape)
    drawn = np.clip(counts + rng.normal(0.0, sigma, counts.shape), 0, None)
    return np.array([macro_f1(m) for m in drawn]), np.array([accuracy(m) for m in drawn])


def _basic(estimate: float, replicates: np.ndarray) -> Interval:
    """The basic bootstrap interval: the estimate less the replicates' spread about their centre."""
    tail = (1 - CONFIDENCE) / 2
    low, high = np.quantile(replicates, [tail, 1 - tail])
    return Interval(*(round(float(x), 4) for x in (estimate, 2 * estimate - high, 2 * estimate - low)))
