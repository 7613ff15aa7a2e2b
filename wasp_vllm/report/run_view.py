"""What ``wasp-vllm report`` reads: a finished run's published files, and (for the operator only)
the FID per round against the raw private records.  :mod:`wasp_vllm.report.page` renders it."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq

from wasp_vllm.privacy.report import PrivacyReport
from wasp_vllm.report.settings import ReportSettings


class ReportError(ValueError):
    """A folder that is not a finished run, or private data that cannot be compared with it."""


@dataclass
class RunView:
    """What the report reads from a run directory: the manifest and the synthetic rows (no embeddings)."""

    run_dir: Path
    manifest: dict[str, Any]
    rows: list[dict[str, Any]]
    plms: list[str]
    labels: list[str]
    finished_at: datetime

    @property
    def config(self) -> dict[str, Any]:
        return dict(self.manifest.get("config", {}))

    @property
    def privacy(self) -> PrivacyReport:
        """The run's privacy section, typed."""
        return PrivacyReport.from_json(self.manifest["privacy"])


@dataclass
class OperatorFigures:
    """FID per round against the raw private records: the operator's, never published."""

    fid_by_round: dict[int, float]
    source: str
    m: int | None
    seed: int
    embedder: str
    n_private: int


def load_run(run_dir: Path) -> RunView:
    """Read ``manifest.json`` and ``synthetic.parquet`` of a finished run."""
    manifest_path, synthetic_path = run_dir / "manifest.json", run_dir / "synthetic.parquet"
    for path in (manifest_path, synthetic_path):
        if not path.is_file():
            raise ReportError(f"{run_dir} is not a finished run: {path.name} is missing")
    manifest = json.loads(manifest_path.read_text())
    columns = [c for c in ("text", "label", "plm", "round", "prompt_kind") if c in _columns(synthetic_path)]
    rows = pq.read_table(synthetic_path, columns=columns).to_pylist()
    plms = list(manifest.get("config", {}).get("plms") or sorted({str(r.get("plm")) for r in rows}))
    stamp = datetime.fromtimestamp(manifest_path.stat().st_mtime, tz=timezone.utc)
    return RunView(run_dir, manifest, rows, plms, _label_order(manifest, rows), stamp)


def _columns(path: Path) -> list[str]:
    return list(pq.read_schema(path).names)


def _label_order(manifest: dict[str, Any], rows: list[dict[str, Any]]) -> list[str]:
    """The task's labels in its order (as the manifest records the task, or where it resolves
    here), then any other label seen."""
    seen = sorted({str(r.get("label")) for r in rows})
    try:
        from wasp_vllm.pipeline.manifest import recorded_task

        labels = list(recorded_task(manifest).labels)
    except (ValueError, OSError):
        labels = []
    return labels + [x for x in seen if x not in labels]


def operator_fid(view: RunView, settings: ReportSettings) -> OperatorFigures:
    """FID of the synthetic set up to each round against the private records (``load_private``)."""
    from wasp_vllm.data.records import Columns, load_private
    from wasp_vllm.engines.embedder import Embedder
    from wasp_vllm.evaluation import fid_per_round, read_synthetic
    from wasp_vllm.pipeline.manifest import recorded_task

    cfg = view.config
    task = recorded_task(view.manifest)
    private = settings.private
    if private is None:
        raise ReportError("the operator's FID needs the private set (--private)")
    m = cfg.get("private_limit") if settings.private_limit is None else settings.private_limit
    seed = int(cfg.get("seed", 0)) if settings.seed is None else settings.seed
    synth = read_synthetic(view.run_dir / "synthetic.parquet", task)
    if synth.rounds is None or synth.embeddings is None:
        raise ReportError("synthetic.parquet has no `round` or no `embedding` column: cannot compute FID")
    name = synth.embedder_name or str(cfg.get("embedder", "auto"))
    embedder = Embedder(name)
    if int(embedder.dim) != synth.embeddings.shape[1]:
        raise ReportError(
            f"embedder {name} gives {embedder.dim}-d vectors, "
            f"the stored ones have {synth.embeddings.shape[1]}"
        )
    data = load_private(
        private,
        task,
        Columns(str(cfg.get("text_col", "text")), str(cfg.get("label_col", "label"))),
        limit=m,
        seed=seed,
    )
    private_emb = np.asarray(embedder.encode(data.texts), dtype=np.float32)
    per_round = fid_per_round(synth.embeddings, synth.rounds, private_emb)
    return OperatorFigures(per_round, private, m, seed, name, len(data))


def label_counts(view: RunView) -> dict[str, dict[str, int]]:
    """Synthetic samples per label and PLM, zeros included."""
    counts = {label: dict.fromkeys(view.plms, 0) for label in view.labels}
    for row in view.rows:
        cell = counts.setdefault(str(row.get("label")), dict.fromkeys(view.plms, 0))
        plm = str(row.get("plm"))
        cell[plm] = cell.get(plm, 0) + 1
    return counts
