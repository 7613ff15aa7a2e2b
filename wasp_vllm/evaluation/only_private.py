"""The OnlyPrivate baseline: the task model trained on the private records alone (no DP).

Kept apart from :mod:`wasp_vllm.evaluation.runner` (which scores synthetic sets): everything
this module returns is computed on the raw private records, so all of it is the operator's.
"""

from __future__ import annotations

from wasp_vllm.evaluation.bert import BertSettings
from wasp_vllm.evaluation.classifier import LabelledTexts, TextEncoder, train_and_score
from wasp_vllm.evaluation.common import EvaluationError
from wasp_vllm.evaluation.metrics import label_balance
from wasp_vllm.evaluation.results import PrivateOnlyScores
from wasp_vllm.evaluation.settings import EvalSettings


def _make_embedder(spec: str) -> TextEncoder:
    from wasp_vllm.engines.embedder import Embedder

    return Embedder(spec)


def evaluate_private_only(
    settings: EvalSettings,
    *,
    embedder: TextEncoder | None = None,
    bert_settings: BertSettings | None = None,
) -> PrivateOnlyScores:
    """The OnlyPrivate baseline: the task model trained on the private records alone (no DP):
    ``settings.private`` drawn as a generation run draws it (``private_limit``, ``seed``).

    It is the reference the paper compares synthetic sets against; it is not private, so
    its score must never be reported as if it had a privacy guarantee.
    """
    from wasp_vllm.data.records import load_private, load_test
    from wasp_vllm.tasks import get_task

    if settings.private is None:
        raise EvaluationError("the OnlyPrivate baseline needs the private set (private=...)")
    task = get_task(settings.task_name())
    private = load_private(
        settings.private, task, settings.columns(), limit=settings.private_limit, seed=settings.seed
    )
    test = load_test(settings.test, task, settings.columns())
    needs_embedder = settings.model.trains_on_embeddings
    enc = embedder if embedder is not None or not needs_embedder else _make_embedder(settings.embedder)
    report = train_and_score(
        LabelledTexts(private.texts, private.labels), LabelledTexts(test.texts, test.labels), task.labels,
        settings.classifier(enc, bert_settings), seed=settings.seed,
    )  # fmt: skip
    return PrivateOnlyScores(
        task=task.name, model=str(settings.model),
        embedder=None if enc is None else str(getattr(enc, "name", type(enc).__name__)), seed=settings.seed,
        n_private=len(private), label_balance=label_balance(private.labels, task.labels), classifier=report,
    )  # fmt: skip
