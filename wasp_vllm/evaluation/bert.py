"""The ``bert`` task model: fine-tune a local BERT-like encoder on the training texts.

The paper fine-tunes BERT; here any local encoder directory (or one in the Hugging Face cache)
serves, with the usual few-epoch, small-batch recipe.  CUDA when present, otherwise slowly on CPU.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from wasp_vllm.engines.devices import torch_device
from wasp_vllm.evaluation.common import EvaluationError

log = logging.getLogger(__name__)

# Hugging Face ids tried in the local cache when model="bert" is given no encoder path.
DEFAULT_BERT_IDS = ("google-bert/bert-base-uncased", "bert-base-uncased")


@dataclass
class BertSettings:
    """Fine-tuning settings for ``model="bert"``: the usual few-epoch, small-batch recipe."""

    epochs: int = 3
    batch_size: int = 16
    learning_rate: float = 3e-5
    weight_decay: float = 0.01
    warmup_fraction: float = 0.1
    max_length: int = 256
    device: str | None = None
    path: str | os.PathLike[str] | None = None  # the local encoder; None = the Hugging Face cache

    def at(self, path: str | os.PathLike[str] | None) -> BertSettings:
        """These settings with the encoder at ``path`` (None keeps the current one)."""
        return self if path is None else replace(self, path=path)


def resolve_bert_path(bert_path: str | os.PathLike[str] | None) -> Path:
    """A local directory with a BERT-like encoder: the given path or HF id, or bert-base-uncased if cached.

    Never downloads; the error says what to do on a machine without the model.
    """
    from wasp_vllm.engines.registry import _snapshot

    if bert_path is not None:
        path = Path(bert_path).expanduser()
        if path.is_dir():
            if not (path / "config.json").exists():
                raise EvaluationError(f"{path} has no config.json: not a transformers model directory")
            return path
        cached = _snapshot(str(bert_path))
        if cached is not None:
            return cached
        raise EvaluationError(
            f"task model 'bert' needs a local encoder: {bert_path!r} is neither a model directory "
            "nor in the local Hugging Face cache"
        )
    for hf_id in DEFAULT_BERT_IDS:
        cached = _snapshot(hf_id)
        if cached is not None:
            return cached
    raise EvaluationError(
        "task model 'bert' needs a local BERT-like encoder: pass bert_path=<model directory> "
        f"(none of {', '.join(DEFAULT_BERT_IDS)} is in the local Hugging Face cache), "
        "or use model='logreg', which needs no download"
    )


def _bert_batches(n: int, batch_size: int, generator: Any) -> list[list[int]]:
    import torch

    order = torch.randperm(n, generator=generator).tolist()
    return [order[i : i + batch_size] for i in range(0, n, batch_size)]


def fit_predict_bert(
    train_texts: Sequence[str],
    train_y: np.ndarray,
    test_texts: Sequence[str],
    num_labels: int,
    seed: int = 0,
    settings: BertSettings | None = None,
) -> np.ndarray:
    """Fine-tune a sequence classifier (``settings.path``) on the training texts and predict the
    test texts."""
    cfg = settings or BertSettings()
    path = resolve_bert_path(cfg.path)  # before the slow imports, so a missing model fails fast
    import torch
    from transformers import (
        AutoModelForSequenceClassification,
        AutoTokenizer,
        get_linear_schedule_with_warmup,
    )

    device = torch_device(cfg.device)
    torch.manual_seed(seed)
    tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    model = AutoModelForSequenceClassification.from_pretrained(
        str(path), num_labels=num_labels, local_files_only=True, ignore_mismatched_sizes=True
    ).to(device)
    log.info("fine-tuning %s (%d epochs, device %s)", path.name, cfg.epochs, device)

    def tokenize(texts: Sequence[str]) -> dict[str, Any]:
        enc = tokenizer(
            list(texts), padding=True, truncation=True, max_length=cfg.max_length, return_tensors="pt"
        )
        return {k: v.to(device) for k, v in enc.items()}

    steps = cfg.epochs * math.ceil(len(train_texts) / cfg.batch_size)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.learning_rate, weight_decay=cfg.weight_decay)
    scheduler = get_linear_schedule_with_warmup(optimizer, int(cfg.warmup_fraction * steps), steps)
    generator = torch.Generator().manual_seed(seed)
    labels = torch.as_tensor(train_y, dtype=torch.long)
    model.train()
    for epoch in range(cfg.epochs):
        total = 0.0
        for batch in _bert_batches(len(train_texts), cfg.batch_size, generator):
            out = model(**tokenize([train_texts[i] for i in batch]), labels=labels[batch].to(device))
            out.loss.backward()
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
            total += float(out.loss.detach()) * len(batch)
        log.info("bert epoch %d/%d: mean loss %.4f", epoch + 1, cfg.epochs, total / len(train_texts))
    return _predict_bert(model, tokenize, test_texts, cfg.batch_size * 2)


def _predict_bert(model: Any, tokenize: Any, texts: Sequence[str], batch_size: int) -> np.ndarray:
    import torch

    model.eval()
    preds: list[np.ndarray] = []
    with torch.no_grad():
        for i in range(0, len(texts), batch_size):
            logits = model(**tokenize(texts[i : i + batch_size])).logits
            preds.append(logits.argmax(dim=-1).cpu().numpy())
    return np.concatenate(preds).astype(np.int64)
