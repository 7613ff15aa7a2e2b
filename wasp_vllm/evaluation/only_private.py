"""The OnlyPrivate baseline: the task model trained on the private records alone (no DP).

Kept apart from :mod:`wasp_vllm.evaluation.runner` (which scores synthetic sets): everything
this module returns is computed on the raw private records, so all of it is the operator's.
"""

from __future__ import annotations

from typing import Any

from wasp_vllm.evaluation.classifier import BertSettings, TextEncoder, train_and_score
from wasp_vllm.evaluation.common import OPERATOR_NOTE
from wasp_vllm.evaluation.metrics import label_balance


def _make_embedder(spec: str) -> TextEncoder:
    from wasp_vllm.engines.embedder import Embedder

    return Embedder(spec)


def evaluate_private_only(
    private_source: str,
    test_source: str,
    task_name: str,
    model: str = "logreg",
    embedder_spec: str = "auto",
    seed: int = 0,
    text_col: str = "text",
    label_col: str = "label",
    *,
    private_limit: int | None = None,
    private_seed: int = 0,
    bert_path: str | None = None,
    bert_settings: BertSettings | None = None,
    embedder: TextEncoder | None = None,
) -> dict[str, Any]:
    """The OnlyPrivate baseline: the task model trained on the private records alone (no DP).

    It is the reference the paper compares synthetic sets against; it is not private, so
    its score must never be reported as if it had a privacy guarantee.
    """
    from wasp_vllm.data.records import load_private, load_test
    from wasp_vllm.tasks import get_task

    task = get_task(task_name)
    private = load_private(
        private_source, task, text_col=text_col, label_col=label_col, limit=private_limit, seed=private_seed
    )
    test = load_test(test_source, task, text_col=text_col, label_col=label_col)
    enc = embedder if embedder is not None or model != "logreg" else _make_embedder(embedder_spec)
    report = train_and_score(
        private.texts,
        private.labels,
        test.texts,
        test.labels,
        task.labels,
        model=model,
        embedder=enc,
        seed=seed,
        bert_path=bert_path,
        bert_settings=bert_settings,
    )
    return {
        "kind": "only_private",
        "differentially_private": False,
        "note": OPERATOR_NOTE,
        "task": task.name,
        "model": model,
        "embedder": None if enc is None else str(getattr(enc, "name", type(enc).__name__)),
        "seed": seed,
        "n_private": len(private),
        "label_balance": label_balance(private.labels, task.labels),
        "accuracy": report.accuracy,
        "macro_f1": report.macro_f1,
        "classifier": report.to_dict(),
    }
