"""``wasp-vllm publish RUN DIR``: a folder holding only what a run may publish, and its card.

The folder gets the run's published files (:data:`wasp_vllm.pipeline.store.PUBLISHED`: the synthetic rows,
the manifest and the card ``README.md``) and nothing from ``private/``; ``datasets.load_dataset(DIR)``
reads it (the card's header names ``synthetic.parquet`` as the data).  It is written in a
temporary folder beside ``DIR`` and renamed into place, so ``DIR`` holds the old content or the new,
never a mix; an existing non-empty ``DIR`` is replaced only when asked.  A run whose epsilon is void
(its noise came from a public ``--noise-seed``) is refused unless the caller says so explicitly.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from wasp_vllm.pipeline.card import CARD_FILE, card_for_run
from wasp_vllm.pipeline.manifest import recorded_task
from wasp_vllm.pipeline.store import PUBLISHED, sha256_file
from wasp_vllm.privacy.report import PrivacyReport
from wasp_vllm.privacy.secrets import OPERATOR_DIR
from wasp_vllm.tasks import TaskError, TaskSpec

log = logging.getLogger(__name__)


class PublishError(ValueError):
    """A run that cannot be published (unfinished, altered, void epsilon) or a destination in the way."""


def read_finished_run(run_dir: Path) -> dict[str, Any]:
    """The manifest of a finished run whose synthetic file is the one it describes."""
    manifest_path, synthetic = run_dir / "manifest.json", run_dir / "synthetic.parquet"
    for path in (manifest_path, synthetic):
        if not path.is_file():
            raise PublishError(f"{run_dir} is not a finished run: {path.name} is missing")
    try:
        manifest = json.loads(manifest_path.read_text())
        expected = manifest["output"]["sha256"]
        PrivacyReport.from_json(manifest["privacy"])  # the card and the void check read it typed
    except (ValueError, KeyError, TypeError):
        raise PublishError(f"{manifest_path} is not a wasp-vllm manifest") from None
    if sha256_file(synthetic) != expected:
        raise PublishError(f"{synthetic} is not the file its manifest describes (its sha256 differs)")
    return dict(manifest)


def check_destination(run_dir: Path, dest: Path, overwrite: bool) -> None:
    """Refuse a destination inside the run, a file, or a non-empty folder without ``overwrite``."""
    run, target = run_dir.resolve(), dest.resolve()
    if target == run or target.is_relative_to(run / OPERATOR_DIR) or run.is_relative_to(target):
        raise PublishError(f"{dest} would mix the published folder with the run: choose another folder")
    if target.exists() and not target.is_dir():
        raise PublishError(f"{dest} exists and is not a folder")
    if target.is_dir() and any(target.iterdir()) and not overwrite:
        raise PublishError(f"{dest} is not empty: pass --overwrite to replace what it holds")


def publish_run(
    run_dir: str | Path,
    dest: str | Path,
    *,
    overwrite: bool = False,
    allow_void_epsilon: bool = False,
    license: str | None = None,
) -> list[Path]:
    """Write ``dest`` with the run's published files and its card; return the files written.

    ``license`` rewrites the card with another licence (a Hugging Face licence id)."""
    run, target = Path(run_dir), Path(dest)
    manifest = read_finished_run(run)
    if PrivacyReport.from_json(manifest["privacy"]).epsilon_void and not allow_void_epsilon:
        raise PublishError(
            f"{run} has no privacy guarantee: its noise came from a public --noise-seed, so its epsilon "
            "is void. Pass --allow-void-epsilon to publish it anyway (its card says so)"
        )
    check_destination(run, target, overwrite)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.publishing-", dir=target.parent))
    try:
        for name in PUBLISHED:
            if name != CARD_FILE:
                shutil.copyfile(run / name, staging / name)
        card = _card(run, manifest, license)
        (staging / CARD_FILE).write_text(card, encoding="utf-8")
        for path in staging.iterdir():
            _fsync(path)
        os.chmod(staging, 0o755)
        _swap_into_place(staging, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return sorted(target / name for name in PUBLISHED)


def _card(run: Path, manifest: dict[str, Any], license: str | None) -> str:
    """The run's own card, or one made again (another licence, or a run from before cards)."""
    if license is None and (run / CARD_FILE).is_file():
        return (run / CARD_FILE).read_text(encoding="utf-8")
    labels = pq.read_table(run / "synthetic.parquet", columns=["label"])
    return card_for_run(manifest, labels, _task_of(manifest), license=license)


def _task_of(manifest: dict[str, Any]) -> TaskSpec | None:
    """The run's task as its manifest records it, else where it resolves here (a task file of an
    older run may be elsewhere: then None)."""
    try:
        return recorded_task(manifest)
    except (TaskError, OSError):
        return None


def _fsync(path: Path) -> None:
    with open(path, "rb") as fh:
        os.fsync(fh.fileno())


def _swap_into_place(staging: Path, target: Path) -> None:
    """``staging`` becomes ``target``; an old ``target`` is moved aside first and removed after."""
    if not target.exists():
        os.replace(staging, target)
        return
    old = Path(tempfile.mkdtemp(prefix=f".{target.name}.old-", dir=target.parent))
    old.rmdir()
    os.replace(target, old)
    try:
        os.replace(staging, target)
    except OSError:
        os.replace(old, target)  # put the old folder back: nothing is lost
        raise
    shutil.rmtree(old, ignore_errors=True)
