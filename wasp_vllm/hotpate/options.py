"""What ``wasp-vllm hotpate`` asks for: one settings value, from which the command's options are made.

Each option's name, help and panel are written here once; a default that a Hot PATE run already
has (the teachers' sizing, the accounting, the token cap) is read from :class:`HotPateSettings`
or :class:`TeacherModel`, and the budget's from the run settings, so no default is spelled twice.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from wasp_vllm.config import PrivacySettings, setting
from wasp_vllm.hotpate.ensembles import EnsembleKind
from wasp_vllm.hotpate.generate import TeacherModel
from wasp_vllm.hotpate.settings import HotPateSettings
from wasp_vllm.hotpate.steps import Accounting

# Help panels of `wasp-vllm hotpate --help`.
DATA, TEACHERS, PRIVACY = "Private data", "Teachers and records", "Privacy"


def _default(owner: type, name: str) -> Any:
    """The default a dataclass field already has."""
    return next(f.default for f in dataclasses.fields(owner) if f.name == name)


def _privacy_default(name: str) -> Any:
    """A budget default of a WASP run (its privacy role), shared by a Hot PATE run."""
    return PrivacySettings.model_fields[name].default


class HotPateOptions(BaseModel):
    """Every choice of a Hot PATE run made on the command line."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    private: str = setting("drugs", "Private data: a file, or 'drugs' (its fit split).", DATA)
    task: str = setting("drugs", "Task name or task file.", DATA)
    text_col: str = setting("text", "Text column of the private file.", DATA)
    label_col: str = setting("label", "Label column of the private file.", DATA)
    private_limit: int = setting(
        600, "Draw M records (keyed hash); M is public and sizes the teachers.", DATA, flag="--m", ge=1
    )
    n: int = setting(10, "Synthetic records to write.", TEACHERS, flag="--n", ge=1)
    model: str = setting(
        _default(TeacherModel, "model"), "PLM preset or model directory (as generate's --plms names one).",
        TEACHERS, flag="--plm",
    )  # fmt: skip
    engine: Literal["auto", "hf", "vllm"] = setting(
        _default(TeacherModel, "engine"),
        "'hf' (transformers), 'vllm' (top-K) or 'auto' (vLLM only on a "
        "GPU with VLLM_BATCH_INVARIANT=1, else transformers).",
        TEACHERS,
    )
    records_per_teacher: int = setting(
        _default(HotPateSettings, "records_per_teacher"),
        "Records per teacher: ceil(M / (this * labels)) teachers per label.", TEACHERS, ge=1,
    )  # fmt: skip
    teachers: int | None = setting(
        _default(HotPateSettings, "teachers"), "Teachers per label (overrides the sizing).", TEACHERS, ge=1
    )
    ensemble: EnsembleKind = setting(
        _default(HotPateSettings, "ensemble"),
        "'coordinated' (Hot PATE) or 'independent' (cold PATE).",
        TEACHERS,
    )
    max_tokens: int = setting(
        _default(HotPateSettings, "max_tokens"), "Tokens per synthetic record.", TEACHERS,
        flag="--max-new-tokens", ge=1,
    )  # fmt: skip
    seed: int = setting(
        _default(HotPateSettings, "seed"),
        "Seed of the shared randomness, the prompts and the --m draw.",
        TEACHERS,
    )
    epsilon: float = setting(
        _privacy_default("epsilon"), "Privacy budget for all generated tokens.", PRIVACY, gt=0
    )
    delta: float = setting(
        _privacy_default("delta"), "Privacy parameter delta, in (0, 1).", PRIVACY, gt=0, lt=1
    )
    accounting: Accounting = setting(
        _default(HotPateSettings, "accounting"),
        "'gaussian' (pay per query) or 'target-charging' (pay per borderline call).", PRIVACY,
        flag="--accountant",
    )  # fmt: skip
    threshold_fraction: float = setting(
        _default(HotPateSettings, "threshold_fraction"),
        "Threshold as a share of the teachers, in (0.5, 1]; sets the noise of either accounting.", PRIVACY,
        gt=0.5, le=1,
    )  # fmt: skip

    def run_settings(self) -> dict[str, Any]:
        """The :class:`HotPateSettings` fields these options set (the rest keep their defaults)."""
        names = ("accounting", "records_per_teacher", "teachers", "ensemble", "threshold_fraction",
                 "max_tokens", "epsilon", "delta", "seed")  # fmt: skip
        return {name: getattr(self, name) for name in names} | {
            "requested_m": self.private_limit,
            "n_samples": self.n,
        }
