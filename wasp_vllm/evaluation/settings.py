"""What an evaluation reads and how it scores: one settings value for ``evaluate``, the Python API,
the OnlyPrivate baseline and the benchmarks.

``wasp-vllm evaluate`` builds one option per field from it (``cli/options.py``), as ``generate``
does from ``RunConfig``: each setting's name, default and help live here and nowhere else.
"""

from __future__ import annotations

from enum import StrEnum
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict

from wasp_vllm.config import setting

if TYPE_CHECKING:
    from wasp_vllm.data.records import Columns
    from wasp_vllm.evaluation.bert import BertSettings
    from wasp_vllm.evaluation.classifier import TaskClassifier, TextEncoder

# Help panels of `wasp-vllm evaluate --help`.
SCORED, REAL, MODEL = "What is scored", "Real records beside it", "Task model"


class TaskModel(StrEnum):
    """The classifier trained on the synthetic (or private) set and scored on the test set."""

    LOGREG = "logreg"  # logistic regression on sentence embeddings (CPU, seconds)
    BERT = "bert"  # a local BERT-like model, fine-tuned (--bert-path)

    @property
    def trains_on_embeddings(self) -> bool:
        """Whether this model learns from the sentence embedder's vectors (BERT reads the texts)."""
        return self is TaskModel.LOGREG


class EvalSettings(BaseModel):
    """Everything that decides what an evaluation reads and how it scores."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    test: str = setting(
        ..., "Real labelled test set: a file, or a built-in set name ('drugs' = its test split; "
        "'drugs:validation' for choosing settings).", SCORED,
    )  # fmt: skip
    task: str | None = setting(
        None, "Task name or task file (gives the label set; default: the one the run's manifest records).",
        SCORED,
    )  # fmt: skip
    text_col: str = setting("text", "Text column of the test, private and reference files.", SCORED)
    label_col: str = setting("label", "Label column of the test, private and reference files.", SCORED)
    private: str | None = setting(
        None, "Private set: the FID of the synthetic set against it (the operator's figure); for "
        "the OnlyPrivate baseline, the records the task model trains on.", REAL,
    )  # fmt: skip
    private_limit: int | None = setting(
        None, "M of the private draw (default: the run's, from its manifest): the records it drew from "
        "--private.", REAL, flag="--m", ge=1,
    )  # fmt: skip
    reference: str | None = setting(
        None, "A real labelled set (never the test split; 'drugs' = its fit split) for the label "
        "agreement: the share of synthetic samples a classifier trained on it labels alike.", REAL,
    )  # fmt: skip
    reference_public: bool = setting(
        False, "Whether --reference holds no private record (refused when it is, or overlaps, the "
        "run's private data or --private). Private (default): the label agreement, an un-noised "
        "statistic of the reference, goes into the operator_only section.", REAL,
        flag="--reference-public/--reference-private",
    )  # fmt: skip
    seed: int = setting(
        0, "Seed of the task model, and of the private draw (default: the run's, from its manifest).", MODEL
    )
    model: TaskModel = setting(
        TaskModel.LOGREG,
        "Task model: 'logreg' (CPU, on embeddings) or 'bert' (fine-tune --bert-path).",
        MODEL,
        flag="--task-model",
    )
    bert_path: str | None = setting(None, "Local BERT-like model directory for --task-model bert.", MODEL)
    embedder: str = setting("auto", "Sentence embedder for logreg, FID and the label agreement.", MODEL)
    fid_method: Literal["sqrtm", "eigh"] = setting(
        "sqrtm", "FID's matrix square root: 'sqrtm' (as published FID code) or 'eigh' (faster, same value).",
        MODEL,
    )  # fmt: skip

    def task_name(self) -> str:
        """The task these settings name; an evaluation is never scored on a task nobody chose."""
        if self.task is None:
            from wasp_vllm.evaluation.common import EvaluationError

            raise EvaluationError(
                "no task to score on: pass --task NAME or FILE, or evaluate beside the run's manifest"
            )
        return self.task

    def columns(self) -> Columns:
        """The text and label columns of the test, private and reference files."""
        from wasp_vllm.data.records import Columns

        return Columns(self.text_col, self.label_col)

    def classifier(self, embedder: TextEncoder | None, recipe: BertSettings | None = None) -> TaskClassifier:
        """The task model these settings name: logreg on ``embedder``'s sentence embeddings, or
        BERT fine-tuned by ``recipe`` at ``--bert-path``."""
        from wasp_vllm.evaluation.classifier import BertClassifier, LogRegClassifier

        if self.model == TaskModel.BERT:
            return BertClassifier(self.bert(recipe))
        return LogRegClassifier(embedder)

    def bert(self, recipe: BertSettings | None = None) -> BertSettings:
        """The fine-tuning recipe (default: BertSettings') with ``--bert-path`` as its encoder."""
        from wasp_vllm.evaluation.bert import BertSettings

        return (recipe or BertSettings()).at(self.bert_path)
