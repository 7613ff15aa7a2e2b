"""The label descriptions alone: each text gets the label whose description (the task file's
``label_descriptions``) is nearest to it in the sentence embedder's space.

It needs no data and no generation, so it is the reference point beside every score of a
synthetic set: a set scoring below it taught the task model nothing the descriptions did not
already say (the label check keeps only samples this rule reads as their label, so a set can reach
little beyond it).  ``evaluate`` reports it on the test set, the utility check on the private
records (its third confusion matrix).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from sklearn.metrics import accuracy_score, f1_score


def unit_rows(matrix: np.ndarray, dtype: type[np.floating] = np.float32) -> np.ndarray:
    """Each row scaled to unit length, as ``dtype`` (a zero row stays zero)."""
    rows = np.asarray(matrix, dtype=dtype)
    return rows / np.maximum(np.linalg.norm(rows, axis=1, keepdims=True), 1e-12)


def description_prototypes(task: Any, embedder: Any) -> np.ndarray:
    """[labels, d]: each label's description, embedded and scaled to unit length."""
    return unit_rows(embedder.encode([task.label_text(label) for label in task.labels]))


def nearest_description(embeddings: np.ndarray, prototypes: np.ndarray) -> np.ndarray:
    """The label index whose description is nearest (cosine) to each embedded text."""
    return np.asarray((unit_rows(embeddings) @ prototypes.T).argmax(axis=1), dtype=np.int64)


@dataclass(frozen=True)
class DescriptionsScore:
    """The label descriptions' scores on a labelled set, and how a synthetic set's macro-F1 reads
    beside them."""

    accuracy: float
    macro_f1: float

    def reading(self, synthetic_macro_f1: float) -> str:
        gap = synthetic_macro_f1 - self.macro_f1
        if gap < 0:
            return (
                f"below what the label descriptions alone give ({self.macro_f1:.3f}, {gap:+.3f}): "
                "the synthetic set adds nothing here"
            )
        return f"above what the label descriptions alone give ({self.macro_f1:.3f}, {gap:+.3f})"

    def to_json(self) -> dict[str, float]:
        return {"accuracy": round(self.accuracy, 4), "macro_f1": round(self.macro_f1, 4)}


def descriptions_score(
    task: Any, embedder: Any, embeddings: np.ndarray, labels: np.ndarray
) -> DescriptionsScore:
    """The label descriptions alone, scored on texts embedded by ``embedder`` (``embeddings``;
    labels as indices into the task's)."""
    predicted = nearest_description(np.asarray(embeddings), description_prototypes(task, embedder))
    truth = np.asarray(labels, dtype=np.int64)
    return DescriptionsScore(
        float(accuracy_score(truth, predicted)),
        float(f1_score(truth, predicted, average="macro", zero_division=0)),
    )
