"""End-to-end evaluation of a synthetic Parquet file (and the OnlyPrivate baseline).

This is the edge where files, tasks and the embedder meet the plain-array functions of
``classifier`` and ``metrics``.  Private texts are embedded for FID and (OnlyPrivate)
used for training, but never logged or returned: results hold counts and scores only.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from wasp_vllm.evaluation.bert import BertSettings
from wasp_vllm.evaluation.classifier import (
    LabelledTexts,
    TextEncoder,
    label_agreement,
    train_and_score,
)
from wasp_vllm.evaluation.common import EvaluationError
from wasp_vllm.evaluation.descriptions import descriptions_score
from wasp_vllm.evaluation.metrics import fid, fid_per_round, label_balance
from wasp_vllm.evaluation.reference import check_declared_public
from wasp_vllm.evaluation.results import LabelAgreement, OperatorFigures, SyntheticCounts, SyntheticScores
from wasp_vllm.evaluation.settings import EvalSettings

if TYPE_CHECKING:
    from wasp_vllm.tasks import TaskSpec

log = logging.getLogger(__name__)

_REQUIRED_COLUMNS = ("text", "label")
# Schema-metadata keys under which a writer may have recorded the embedder of the `embedding` column.
_EMBEDDER_META_KEYS = (b"embedder", b"wasp.embedder", b"embedder_name")


@dataclass
class SyntheticSet:
    """The usable rows of a synthetic Parquet file, labels as indices into the task's labels."""

    texts: list[str]
    labels: np.ndarray
    rounds: np.ndarray | None
    plms: list[str] | None
    embeddings: np.ndarray | None
    embedder_name: str | None
    n_rows: int
    n_dropped_null_text: int
    n_dropped_unknown_label: int


def _embedding_matrix(column: pa.ChunkedArray) -> np.ndarray | None:
    """[n, d] float32 from a fixed_size_list (or equal-length list) column; None if it has nulls."""
    if column.null_count:
        return None
    arr = column.combine_chunks()
    if pa.types.is_fixed_size_list(arr.type):
        width = arr.type.list_size
        return np.asarray(arr.flatten().to_numpy(zero_copy_only=False), dtype=np.float32).reshape(-1, width)
    if pa.types.is_list(arr.type) or pa.types.is_large_list(arr.type):
        rows = arr.to_pylist()
        if rows and len({len(r) for r in rows}) == 1:
            return np.asarray(rows, dtype=np.float32)
    return None


def _stored_embedder(schema: pa.Schema) -> str | None:
    meta = schema.metadata or {}
    for key in _EMBEDDER_META_KEYS:
        if key in meta:
            return meta[key].decode("utf-8", "replace")
    return None


def _label_indices(values: list[Any], task: Any) -> np.ndarray:
    """Index per row into task.labels, -1 for null or unknown labels (spellings via the task's aliases)."""
    from wasp_vllm.tasks import normalize_label_key

    mapping = task.alias_map()
    index = {label: i for i, label in enumerate(task.labels)}
    out = np.full(len(values), -1, dtype=np.int64)
    for i, value in enumerate(values):
        label = None if value is None else mapping.get(normalize_label_key(str(value)))
        if label is not None:
            out[i] = index[label]
    return out


def _optional_column(table: pa.Table, name: str, idx: np.ndarray) -> list[Any] | None:
    """Values of an optional column at the kept rows; None when absent or with nulls there."""
    if name not in table.column_names:
        return None
    values = table.column(name).to_pylist()
    kept = [values[i] for i in idx]
    return None if any(v is None for v in kept) else kept


def read_synthetic(path: str | os.PathLike[str], task: Any) -> SyntheticSet:
    """Read the pipeline's Parquet output; drop rows with a null text or a label not in the task.

    Dropping (with a warning and a count in the result) rather than failing, because a
    generator occasionally emits junk and the rest of the set is still worth scoring.
    """
    table = pq.read_table(path)
    missing = [c for c in _REQUIRED_COLUMNS if c not in table.column_names]
    if missing:
        raise EvaluationError(f"{path}: missing column(s) {missing}; found {table.column_names}")
    texts = table.column("text").to_pylist()
    labels = _label_indices(table.column("label").to_pylist(), task)
    null_text = np.array([t is None for t in texts], dtype=bool)
    unknown = (labels < 0) & ~null_text
    keep = ~null_text & ~unknown
    if null_text.any() or unknown.any():
        log.warning(
            "%s: dropping %d rows with null text, %d with unknown label", path, null_text.sum(), unknown.sum()
        )
    idx = np.flatnonzero(keep)
    rounds = _optional_column(table, "round", idx)
    plms = _optional_column(table, "plm", idx)
    emb = _embedding_matrix(table.column("embedding")) if "embedding" in table.column_names else None
    return SyntheticSet(
        texts=[texts[i] for i in idx],
        labels=labels[idx],
        rounds=None if rounds is None else np.asarray(rounds, dtype=np.int64),
        plms=None if plms is None else [str(p) for p in plms],
        embeddings=None if emb is None else emb[idx],
        embedder_name=_stored_embedder(table.schema),
        n_rows=table.num_rows,
        n_dropped_null_text=int(null_text.sum()),
        n_dropped_unknown_label=int(unknown.sum()),
    )


def _synthetic_embeddings(synth: SyntheticSet, embedder: Any) -> tuple[np.ndarray, bool]:
    """Stored embeddings when they come from this embedder (same dimension, no contrary metadata)."""
    stored = synth.embeddings
    same_name = synth.embedder_name is None or synth.embedder_name == getattr(embedder, "name", None)
    if stored is not None and stored.shape[1] == int(embedder.dim) and same_name:
        return stored, True
    if stored is not None:
        log.info(
            "re-embedding: stored embeddings (dim %d, embedder %s) do not match %s (dim %d)",
            stored.shape[1],
            synth.embedder_name,
            getattr(embedder, "name", "?"),
            embedder.dim,
        )
    return np.asarray(embedder.encode(synth.texts), dtype=np.float32), False


def _counts(values: list[Any] | np.ndarray | None) -> dict[str, int] | None:
    if values is None:
        return None
    keys, counts = np.unique(np.asarray([str(v) for v in values]), return_counts=True)
    return {str(k): int(c) for k, c in zip(keys, counts, strict=True)}


def _make_embedder(spec: str) -> TextEncoder:
    from wasp_vllm.engines.embedder import Embedder

    return Embedder(spec)


def evaluate_synthetic(
    synthetic_path: str | os.PathLike[str],
    settings: EvalSettings,
    *,
    embedder: TextEncoder | None = None,
    bert_settings: BertSettings | None = None,
    task: TaskSpec | None = None,
    test_table: pa.Table | None = None,
) -> SyntheticScores:
    """Score a synthetic set: task model trained on it, accuracy on the test set, FID vs private.

    ``settings.reference`` (a labelled set, never the test split) adds the label agreement: the
    share of synthetic samples whose label a classifier trained on it gives too.  A classifier
    trained on the reference is an un-noised statistic of its records, so the figure goes into the
    operator's section unless ``reference_public`` declares that the reference holds no private
    record (then it is published as ``label_agreement``).  FID (the operator's figure) only with
    ``settings.private``, drawn as the generation run drew it (``private_limit``, ``seed``).
    ``embedder`` overrides ``settings.embedder`` with a ready encoder; ``task`` the task
    ``settings.task`` names (the one a run's manifest records, whose file may be elsewhere);
    ``test_table`` holds in-memory test records, read instead of ``settings.test``.
    """
    from wasp_vllm.data.records import load_test
    from wasp_vllm.tasks import get_task

    task = task or get_task(settings.task_name())
    if settings.reference is not None and settings.reference_public:  # before any work: the user's mistake
        check_declared_public(settings, task, Path(synthetic_path))
    synth = read_synthetic(synthetic_path, task)
    if not synth.texts:
        raise EvaluationError(f"{synthetic_path}: no usable synthetic rows (of {synth.n_rows})")
    test = load_test(settings.test, task, settings.columns(), table=test_table)
    # FID, the label agreement and the label descriptions' score need embeddings whatever the task model
    enc = embedder if embedder is not None else _make_embedder(settings.embedder)
    synth_emb, reused = _synthetic_embeddings(synth, enc)
    test_emb = np.asarray(enc.encode(list(test.texts)))  # once: the task model and the descriptions
    on_embeddings = settings.model.trains_on_embeddings
    train = LabelledTexts(synth.texts, synth.labels, synth_emb if on_embeddings else None)
    scored = LabelledTexts(test.texts, test.labels, test_emb if on_embeddings else None)
    report = train_and_score(
        train, scored, task.labels, settings.classifier(enc, bert_settings), seed=settings.seed
    )
    public, operator = _against_real_records(synth, synth_emb, enc, task, settings)
    descriptions = descriptions_score(task, enc, test_emb, test.labels)  # the reference point
    log.info("evaluated %s: accuracy %.4f", synthetic_path, report.accuracy)
    return SyntheticScores(
        synthetic_path=str(Path(synthetic_path)), task=task.name, model=str(settings.model),
        embedder=str(getattr(enc, "name", type(enc).__name__)),
        reused_stored_embeddings=reused, seed=settings.seed, counts=_describe_synthetic(synth, task.labels),
        classifier=report, fid_method=settings.fid_method,
        label_agreement=public, operator=operator, descriptions=descriptions,
    )  # fmt: skip


def _against_real_records(
    synth: SyntheticSet, synth_emb: np.ndarray, enc: TextEncoder, task: Any, settings: EvalSettings
) -> tuple[LabelAgreement | None, OperatorFigures | None]:
    """The label agreement against the reference (published only when declared public) and the
    operator's figures: FID against the private records, a private reference's agreement."""
    from wasp_vllm.data.records import load_private

    columns = settings.columns()
    reference, public = settings.reference, settings.reference_public
    fid_figures: dict[str, Any] = {}
    if settings.private is not None:
        records = load_private(
            settings.private, task, columns, limit=settings.private_limit, seed=settings.seed
        )
        private_emb = enc.encode(records.texts)
        fid_figures = _fid_figures(synth, synth_emb, private_emb, settings.fid_method)
    agreement = None
    if reference is not None:
        ref = load_private(reference, task, columns)
        shares = label_agreement(
            synth_emb, synth.labels, enc.encode(ref.texts), ref.labels, task.labels, settings.seed
        )
        agreement = LabelAgreement(**shares, reference=str(reference), reference_public=public)
    if public and agreement is not None:
        return agreement, (OperatorFigures(**fid_figures) if fid_figures else None)
    # possibly private records: an un-noised statistic of them stays with the operator
    if not fid_figures and agreement is None:
        return None, None
    return None, OperatorFigures(**fid_figures, label_agreement=agreement)


def _describe_synthetic(synth: SyntheticSet, label_names: list[str]) -> SyntheticCounts:
    """Counts of the synthetic set (public: the synthetic set is)."""
    return SyntheticCounts(
        n_synthetic=len(synth.texts),
        n_rows=synth.n_rows,
        n_dropped_null_text=synth.n_dropped_null_text,
        n_dropped_unknown_label=synth.n_dropped_unknown_label,
        label_balance=label_balance(synth.labels, label_names),
        per_plm_counts=_counts(synth.plms),
        per_round_counts=_counts(synth.rounds),
    )


def _fid_figures(
    synth: SyntheticSet, synth_emb: np.ndarray, private_emb: Any, fid_method: str
) -> dict[str, Any]:
    """FID of the synthetic set against the raw private records: outside the DP accounting."""
    private_emb = np.asarray(private_emb, dtype=np.float32)
    per_round = None
    if synth.rounds is not None:
        per_round = fid_per_round(synth_emb, synth.rounds, private_emb, method=fid_method)
    return {
        "fid": fid(synth_emb, private_emb, method=fid_method),
        "fid_per_round": per_round,
        "n_private": len(private_emb),
    }
