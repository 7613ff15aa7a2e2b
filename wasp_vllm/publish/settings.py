"""What ``wasp-vllm publish`` asks for beside the run and the folder: its options come from here."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from wasp_vllm.config import setting
from wasp_vllm.config.roles import LICENSE_ID

# Help panels of `wasp-vllm publish --help`.
CARD, HUB = "The data set card", "Hugging Face hub"


class PublishSettings(BaseModel):
    """The card's licence, whether a void epsilon may go out, and where on a hub the folder goes."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    license: str | None = setting(
        None, "Licence in the card, a Hugging Face licence id (default: the run's, 'other').", CARD,
        pattern=LICENSE_ID,
    )  # fmt: skip
    allow_void_epsilon: bool = setting(
        False, "Publish a run made with --noise-seed, whose epsilon is void (no privacy guarantee).", CARD,
        flag="--allow-void-epsilon",
    )  # fmt: skip
    push_to_hub: str | None = setting(
        None, "Also upload DEST to this Hugging Face data set repo (OWNER/NAME).", HUB
    )
    endpoint: str | None = setting(
        None, "Hub to push to (default: HF_ENDPOINT, else huggingface.co); token from HF_TOKEN.", HUB
    )
    private_repo: bool = setting(
        False, "Create the hub repo as private (if it does not exist).", HUB, flag="--private-repo"
    )
