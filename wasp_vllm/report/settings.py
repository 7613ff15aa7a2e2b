"""What ``wasp-vllm report`` asks for beside the run: its options are made from these fields."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from wasp_vllm.config import setting

#: The help panel of `wasp-vllm report --help` for the operator's figures.
OPERATOR = "Operator's figures (not shareable)"


class ReportSettings(BaseModel):
    """What ``wasp-vllm report`` adds to a run's published files: the operator's FID per round."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    private: str | None = setting(
        None, "Private set for the operator's FID per round; the report is then NOT shareable.", OPERATOR
    )
    private_limit: int | None = setting(
        None, "Same M as the run (default: the run's).", OPERATOR, flag="--m", ge=1
    )
    seed: int | None = setting(None, "Seed of the --m draw (default: the run's).", OPERATOR)
