"""Judging synthetic data: a downstream task model trained on it, and distribution metrics.

``evaluate_synthetic`` scores a synthetic Parquet file end to end (accuracy and macro-F1
of a task model on the real test split, FID against the private set overall and per
round); ``evaluate_private_only`` is the OnlyPrivate (non-DP) reference.  The building
blocks take plain arrays so they can be reused and tested without files or models.
"""

from wasp_vllm.evaluation.bert import BertSettings, fit_predict_bert, resolve_bert_path
from wasp_vllm.evaluation.classifier import (
    BertClassifier,
    EvalReport,
    LabelledTexts,
    LogRegClassifier,
    TaskClassifier,
    TextEncoder,
    fit_predict_logreg,
    train_and_score,
)
from wasp_vllm.evaluation.common import EvaluationError, to_label_indices
from wasp_vllm.evaluation.metrics import MetricError, fid, fid_per_round, frechet_distance, label_balance
from wasp_vllm.evaluation.only_private import evaluate_private_only
from wasp_vllm.evaluation.plots import plot_accuracy, plot_fid_rounds
from wasp_vllm.evaluation.runner import SyntheticSet, evaluate_synthetic, read_synthetic

__all__ = [
    "BertClassifier",
    "BertSettings",
    "EvalReport",
    "EvaluationError",
    "LabelledTexts",
    "LogRegClassifier",
    "MetricError",
    "SyntheticSet",
    "TaskClassifier",
    "TextEncoder",
    "evaluate_private_only",
    "evaluate_synthetic",
    "fid",
    "fid_per_round",
    "fit_predict_bert",
    "fit_predict_logreg",
    "frechet_distance",
    "label_balance",
    "plot_accuracy",
    "plot_fid_rounds",
    "read_synthetic",
    "resolve_bert_path",
    "to_label_indices",
    "train_and_score",
]
