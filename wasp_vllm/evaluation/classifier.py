"""Downstream task model: train on (synthetic) labelled text, score on the real test split.

This is how the paper judges a synthetic set: the accuracy of a classifier trained on it
alone.  Two task models:

- ``logreg`` (CPU default, no download): logistic regression on sentence embeddings of
  the packaged embedder.  Hyper-parameters are fixed (C=1 on standardised features):
  the only held-out data is the test split, and choosing anything by looking at it
  would inflate every method's score.
- ``bert``: fine-tune a local BERT-like encoder directory (the paper fine-tunes BERT);
  CUDA when present, otherwise slowly on CPU.

Degenerate training sets are reported rather than hidden: a label absent from the
training set is listed in ``missing_train_labels``; a single-class training set yields
the constant predictor (flagged ``degenerate``) because a collapsed generator is a
result a benchmark must show, not a crash that hides the other methods' numbers.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar, Protocol

import numpy as np
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import accuracy_score, f1_score
from sklearn.preprocessing import StandardScaler

from wasp_vllm.evaluation.bert import BertSettings, fit_predict_bert
from wasp_vllm.evaluation.common import EvaluationError, to_label_indices

log = logging.getLogger(__name__)

LOGREG_C = 1.0  # fixed regularisation; see the module docstring for why it is not tuned
LOGREG_MAX_ITER = 2000


class TextEncoder(Protocol):
    """Anything with ``encode(texts) -> float array [n, d]`` (``engines.embedder.Embedder``, say)."""

    def encode(self, texts: Sequence[str]) -> np.ndarray: ...


@dataclass(frozen=True)
class LabelledTexts:
    """One side of a training run: texts and their labels (indices into the label names, or the
    names), plus, where already computed, their sentence embeddings from the task model's
    embedder (logreg then skips encoding) and per-sample training weights."""

    texts: Sequence[str]
    labels: np.ndarray | Sequence[int] | Sequence[str]
    embeddings: np.ndarray | None = None
    weights: np.ndarray | None = None

    def __repr__(self) -> str:  # the texts may be private records: never in a log line
        return f"LabelledTexts({len(self.texts)} texts)"


@dataclass
class EvalReport:
    """Scores of one task model on the test split, plus what its training set looked like.

    ``macro_f1`` averages over the labels present in the test set or predicted (sklearn's
    default), so a label the model never predicts but the test set holds counts as F1 = 0.
    ``per_label_f1`` is None for a label that is neither in the test set nor predicted.
    ``degenerate`` marks the constant predictor used for a single-class training set.
    ``even_mix_macro_f1`` is the macro-F1 the same predictions give when every test sample is
    weighted by one over its label's count: the score on a test set holding each label equally
    often, so that a training set whose label mix matches an uneven test split gains nothing.
    """

    model: str
    accuracy: float
    macro_f1: float
    per_label_f1: dict[str, float | None]
    train_label_counts: dict[str, int]
    test_label_counts: dict[str, int]
    missing_train_labels: list[str]
    n_train: int
    n_test: int
    degenerate: bool = False
    embedder: str | None = None
    seed: int = 0
    notes: list[str] = field(default_factory=list)
    even_mix_macro_f1: float | None = None

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-serialisable dict (floats, ints, strings, lists, None)."""
        return asdict(self)


def _check_inputs(texts: Sequence[str], labels: np.ndarray, what: str) -> None:
    if len(texts) == 0:
        raise EvaluationError(f"the {what} set is empty")
    if len(texts) != len(labels):
        raise EvaluationError(f"{what}: {len(texts)} texts but {len(labels)} labels")


def _counts(labels: np.ndarray, label_names: Sequence[str]) -> dict[str, int]:
    counts = np.bincount(labels, minlength=len(label_names))
    return {name: int(c) for name, c in zip(label_names, counts, strict=True)}


def _encode(embedder: TextEncoder, texts: Sequence[str]) -> np.ndarray:
    emb = np.asarray(embedder.encode(list(texts)), dtype=np.float32)
    if emb.ndim != 2 or emb.shape[0] != len(texts):
        raise EvaluationError(f"embedder returned shape {emb.shape} for {len(texts)} texts")
    return emb


def fit_predict_logreg(
    train_emb: np.ndarray,
    train_y: np.ndarray,
    test_emb: np.ndarray,
    seed: int = 0,
    weights: np.ndarray | None = None,
    class_weight: str | None = None,
) -> np.ndarray:
    """Standardise on the training set, fit a fixed-C logistic regression, predict the test set.

    ``weights``: one per training sample (the run's ``weight`` column).  Needs at least two classes
    in ``train_y`` (the caller handles the single-class case).
    """
    scaler = StandardScaler().fit(train_emb)
    clf = LogisticRegression(
        C=LOGREG_C, max_iter=LOGREG_MAX_ITER, random_state=seed, class_weight=class_weight
    )
    clf.fit(scaler.transform(train_emb), train_y, sample_weight=weights)
    return clf.predict(scaler.transform(test_emb)).astype(np.int64)


def label_agreement(
    synth_emb: np.ndarray,
    synth_labels: np.ndarray,
    reference_emb: np.ndarray,
    reference_labels: np.ndarray,
    label_names: Sequence[str],
    seed: int = 0,
) -> dict[str, Any]:
    """Share of synthetic samples whose label a classifier trained on real reference data gives too.

    The reference classifier is balanced over the labels (so a majority label does not win every
    disagreement); a diagnostic of how well the samples carry their label, not a score to publish
    as private data when the reference set is private.
    """
    pred = fit_predict_logreg(reference_emb, reference_labels, synth_emb, seed, class_weight="balanced")
    agree = pred == np.asarray(synth_labels)
    per_label = {
        name: (float(agree[synth_labels == i].mean()) if (synth_labels == i).any() else None)
        for i, name in enumerate(label_names)
    }
    return {"overall": float(agree.mean()), "per_label": per_label, "n": int(agree.size)}


def _per_label_f1(
    test_y: np.ndarray, pred: np.ndarray, label_names: Sequence[str]
) -> dict[str, float | None]:
    """F1 per label; None for a label that is neither in the test set nor ever predicted (undefined)."""
    scores = f1_score(test_y, pred, labels=np.arange(len(label_names)), average=None, zero_division=0)
    seen = set(np.unique(test_y)) | set(np.unique(pred))
    return {name: (float(scores[i]) if i in seen else None) for i, name in enumerate(label_names)}


class TaskClassifier(Protocol):
    """The evaluation's task model: trained on labelled texts, it predicts the test texts' labels."""

    @property
    def name(self) -> str:
        """What the report calls it ('logreg', 'bert')."""
        ...

    def fit_predict(
        self, train: LabelledTexts, train_y: np.ndarray, test: LabelledTexts, num_labels: int, seed: int
    ) -> np.ndarray: ...

    def embedder_name(self, precomputed: bool) -> str | None:
        """The sentence embedder the model used ("precomputed": the stored embeddings; None: none)."""
        ...


@dataclass
class LogRegClassifier:
    """Logistic regression on sentence embeddings: the stored ones where the texts carry them, else
    ``embedder``'s (the packaged ``auto`` embedder, loaded when first needed, if none is given)."""

    embedder: TextEncoder | None = None
    name: ClassVar[str] = "logreg"

    def fit_predict(
        self, train: LabelledTexts, train_y: np.ndarray, test: LabelledTexts, num_labels: int, seed: int
    ) -> np.ndarray:
        train_embeddings = np.asarray(self._embeddings(train), dtype=np.float32)
        test_embeddings = np.asarray(self._embeddings(test), dtype=np.float32)
        if train_embeddings.shape[0] != len(train_y) or test_embeddings.shape[0] != len(test.texts):
            raise EvaluationError("precomputed embeddings do not match the number of texts")
        if train_embeddings.shape[1] != test_embeddings.shape[1]:
            raise EvaluationError(
                f"train and test embeddings differ in dimension: {train_embeddings.shape[1]} vs "
                f"{test_embeddings.shape[1]}"
            )
        return fit_predict_logreg(train_embeddings, train_y, test_embeddings, seed, train.weights)

    def _embeddings(self, side: LabelledTexts) -> np.ndarray:
        """The stored embeddings, else the embedder's (the default one loaded on first need)."""
        if side.embeddings is not None:
            return side.embeddings
        self.embedder = self.embedder or _default_embedder()
        return _encode(self.embedder, side.texts)

    def embedder_name(self, precomputed: bool) -> str | None:
        if self.embedder is None:
            return "precomputed" if precomputed else None
        return str(getattr(self.embedder, "name", type(self.embedder).__name__))


@dataclass(frozen=True)
class BertClassifier:
    """A local BERT-like encoder fine-tuned on the texts (``settings``: the recipe and the encoder)."""

    settings: BertSettings | None = None
    name: ClassVar[str] = "bert"

    def fit_predict(
        self, train: LabelledTexts, train_y: np.ndarray, test: LabelledTexts, num_labels: int, seed: int
    ) -> np.ndarray:
        return fit_predict_bert(train.texts, train_y, test.texts, num_labels, seed, self.settings)

    def embedder_name(self, precomputed: bool) -> str | None:
        return None


def train_and_score(
    train: LabelledTexts,
    test: LabelledTexts,
    label_names: Sequence[str],
    model: TaskClassifier | None = None,
    seed: int = 0,
) -> EvalReport:
    """Train the task ``model`` (default: :class:`LogRegClassifier` on the ``auto`` embedder) on the
    ``train`` texts and score it on the ``test`` texts.

    Embeddings stored with the texts (from the same embedder; the pipeline stores them) skip
    encoding; the training weights (logreg only) weigh the samples.  Raises ``EvaluationError``
    for an empty set, mismatched lengths, unknown labels, or (bert) no local encoder.
    """
    chosen: TaskClassifier = LogRegClassifier() if model is None else model
    label_names = list(label_names)
    train_y, test_y = _checked_labels(train, test, label_names)
    train_counts = _counts(train_y, label_names)
    missing = [name for name, c in train_counts.items() if c == 0]
    notes = _coverage_notes(missing, label_names)
    present = np.unique(train_y)
    degenerate = present.size == 1
    if degenerate:
        notes.append("single-class training set: scored as the constant predictor of that class")
        log.warning(
            "single-class training set (%s): reporting the constant predictor", label_names[present[0]]
        )
        pred = np.full(len(test.texts), present[0], dtype=np.int64)
    else:
        pred = chosen.fit_predict(train, train_y, test, len(label_names), seed)
    return EvalReport(
        model=chosen.name,
        accuracy=float(accuracy_score(test_y, pred)),
        macro_f1=float(f1_score(test_y, pred, average="macro", zero_division=0)),
        even_mix_macro_f1=_even_mix_macro_f1(test_y, pred),
        per_label_f1=_per_label_f1(test_y, pred, label_names),
        train_label_counts=train_counts,
        test_label_counts=_counts(test_y, label_names),
        missing_train_labels=missing,
        n_train=len(train.texts),
        n_test=len(test.texts),
        degenerate=bool(degenerate),
        embedder=chosen.embedder_name(train.embeddings is not None),
        seed=seed,
        notes=notes,
    )


def _even_mix_macro_f1(test_y: np.ndarray, pred: np.ndarray) -> float:
    counts = np.bincount(test_y)
    weights = 1.0 / counts[test_y]  # each label's samples weigh 1 in all
    return float(f1_score(test_y, pred, average="macro", sample_weight=weights, zero_division=0))


def _checked_labels(
    train: LabelledTexts, test: LabelledTexts, label_names: list[str]
) -> tuple[np.ndarray, np.ndarray]:
    """Label indices of both sets, after checking that texts and labels match."""
    train_y = to_label_indices(train.labels, label_names, what="train labels")
    test_y = to_label_indices(test.labels, label_names, what="test labels")
    _check_inputs(train.texts, train_y, "training")
    _check_inputs(test.texts, test_y, "test")
    return train_y, test_y


def _default_embedder() -> TextEncoder:
    from wasp_vllm.engines.embedder import Embedder

    return Embedder("auto")


def _coverage_notes(missing: list[str], label_names: list[str]) -> list[str]:
    if not missing:
        return []
    log.warning("training set lacks %d of %d labels: %s", len(missing), len(label_names), missing)
    return [f"labels absent from the training set (never predicted): {missing}"]
