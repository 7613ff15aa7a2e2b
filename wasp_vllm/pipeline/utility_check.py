"""The utility check's public half: the task models it asks about, trained on public samples only.

After the last round the run asks how well three task models label its private records: one
trained on the whole synthetic set (the task model ``evaluate`` uses: logistic regression on the
run's sentence embeddings), one trained on round 0's zero-shot samples alone (what the PLMs write
without any private data: a reference that never saw it), and the nearest label description (no
data at all).  The private side, the noisy confusion matrices, is
:meth:`wasp_vllm.privacy.mechanisms.VotingMechanism.release_confusions`; what they say is
:mod:`wasp_vllm.privacy.utility`.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from wasp_vllm.evaluation.classifier import fit_predict_logreg
from wasp_vllm.evaluation.descriptions import description_prototypes, nearest_description
from wasp_vllm.pipeline.store import stored_embeddings
from wasp_vllm.privacy.mechanisms import Classifier
from wasp_vllm.tasks import TaskSpec


def checked_classifiers(synthetic: pa.Table, task: TaskSpec, embedder: Any, seed: int) -> list[Classifier]:
    """The three task models of the check, in the order of ``privacy.utility.CHECKED_SETS``."""
    embeddings = stored_embeddings(synthetic)
    labels = np.array([task.labels.index(x) for x in synthetic.column("label").to_pylist()], dtype=np.int64)
    first = synthetic.column("round").to_numpy() == 0
    prototypes = description_prototypes(task, embedder)
    return [
        task_model(embeddings, labels, seed),
        task_model(embeddings[first], labels[first], seed),
        lambda rows: nearest_description(rows, prototypes),
    ]


def task_model(embeddings: np.ndarray, labels: np.ndarray, seed: int) -> Classifier:
    """Logistic regression on ``embeddings`` (the constant predictor for a one-label set)."""
    if len(np.unique(labels)) < 2:
        constant = int(labels[0]) if len(labels) else 0
        return lambda rows: np.full(len(rows), constant, dtype=np.int64)
    return lambda rows: fit_predict_logreg(embeddings, labels, rows, seed)
