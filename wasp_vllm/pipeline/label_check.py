"""Label fidelity: does a sample read as the label it was written for?  Public data only.

Tiny PLMs often ignore the sentiment they are asked for, so a "negative" sample may praise the
drug; such samples teach the downstream classifier the wrong label.  The check embeds each
label's own description (the task's ``label_descriptions``, e.g. "negative sentiment") with the
run's sentence embedder and calls a sample *off-label* when its embedding is closer (cosine) to
another label's description than to its own.  Off-label samples are rejected and regenerated
(reason ``off_label``).

It reads only the sample, the public task file and the public embedder: no privacy cost.  Why it
works although the descriptions are a poor classifier of *real* records: a synthetic sample was
prompted with its label phrase, and one that took the phrase up sits near it in embedding space,
one that drifted into another sentiment sits nearer that one's phrase.  Measured on the drugs
runs: docs/quality.md, the label check.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from wasp_vllm.evaluation.descriptions import description_prototypes, unit_rows
from wasp_vllm.tasks import TaskSpec


class LabelCheck:
    """``off_label(embeddings, labels)``: which samples read as another label (see module doc)."""

    def __init__(self, task: TaskSpec, embedder: Any) -> None:
        self.embedder = embedder
        # PLMs generate in threads on a GPU; a fast tokenizer shared by two threads can fail
        # ("Already borrowed"), so the check embeds one batch at a time.
        self._lock = threading.Lock()
        self.labels = list(task.labels)
        self.prototypes = description_prototypes(task, embedder)

    def check(self, texts: Sequence[str], labels: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """``(embeddings, off-label mask)`` of a batch of samples; the embeddings are kept by the
        caller, so the round embeds each sample once."""
        with self._lock:
            embeddings = np.asarray(self.embedder.encode(list(texts)), dtype=np.float32)
        return embeddings, self.off_label(embeddings, labels)

    def scores(self, embeddings: np.ndarray) -> np.ndarray:
        """[n, labels] cosine similarity of each sample to each label's description."""
        return unit_rows(embeddings) @ self.prototypes.T

    def leads(self, embeddings: np.ndarray, labels: Sequence[str]) -> np.ndarray:
        """Per sample, its own label's similarity minus the best other label's: positive where the
        sample reads most like its own label, larger the more clearly it does."""
        if len(labels) == 0 or len(self.labels) < 2:  # one label: nothing to read it against
            return np.zeros(len(labels), dtype=np.float32)
        scores = self.scores(embeddings)
        rows = np.arange(len(labels))
        own_col = np.array([self.labels.index(lab) for lab in labels])
        own = scores[rows, own_col]
        scores[rows, own_col] = -np.inf
        return own - scores.max(axis=1)

    def off_label(self, embeddings: np.ndarray, labels: Sequence[str]) -> np.ndarray:
        """Boolean mask: the sample's own label trails the best other label."""
        return self.leads(embeddings, labels) < 0
