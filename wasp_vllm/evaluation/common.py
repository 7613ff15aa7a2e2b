"""Shared pieces of the evaluation modules: the error type, the operator-only section, labels."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

#: Key of the report section computed on (possibly) private records outside the DP accounting.
OPERATOR_ONLY = "operator_only"
OPERATOR_NOTE = (
    "computed on the raw private records outside the differential-privacy accounting: the "
    "operator's figures, NEVER to be published"
)


class EvaluationError(ValueError):
    """An evaluation that cannot be run as asked (empty set, bad labels, missing model)."""


def to_label_indices(
    labels: np.ndarray | Sequence[int] | Sequence[str], label_names: Sequence[str], what: str = "labels"
) -> np.ndarray:
    """Labels as int64 indices into ``label_names``; accepts indices or the names themselves.

    Callers hold labels in both forms (the synthetic Parquet stores names, the data loaders
    return indices), so every public function accepts either and fails loudly on values
    that are not labels of the task instead of silently mis-counting them.
    """
    if len(label_names) == 0:
        raise EvaluationError("label_names is empty")
    arr = np.asarray(labels)
    if arr.size == 0:
        return np.zeros(0, dtype=np.int64)
    arr = arr.reshape(-1)
    if arr.dtype.kind in "iu":
        bad = (arr < 0) | (arr >= len(label_names))
        if bad.any():
            raise EvaluationError(
                f"{int(bad.sum())} {what} are out of range for {len(label_names)} label names"
            )
        return arr.astype(np.int64)
    if arr.dtype.kind in "UO":
        lookup = {name: i for i, name in enumerate(label_names)}
        unknown = sorted({str(v) for v in arr if v not in lookup})
        if unknown:
            raise EvaluationError(
                f"{what} contain values that are not label names of the task: {unknown[:5]} "
                f"(known: {list(label_names)})"
            )
        return np.fromiter((lookup[v] for v in arr), dtype=np.int64, count=arr.size)
    raise EvaluationError(f"{what} must be integer indices or label names, got dtype {arr.dtype}")
