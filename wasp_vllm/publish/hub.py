"""``publish --push-to-hub REPO``: upload a published folder to a Hugging Face Hub data set repo.

``huggingface_hub`` does the work (``create_repo`` with ``exist_ok``, then ``upload_folder``).  The
command line keeps ``HF_HUB_OFFLINE=1`` for everything else it does (no model is ever fetched from a
hub), so the push lifts offline mode for its own requests only.  ``endpoint`` (or ``HF_ENDPOINT``)
names another hub, such as a private mirror; the token comes from ``HF_TOKEN`` or ``hf auth login``,
never from the command line.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from wasp_vllm.publish.folder import PublishError

log = logging.getLogger(__name__)


@contextmanager
def _online() -> Iterator[None]:
    from huggingface_hub import constants

    saved = constants.HF_HUB_OFFLINE
    constants.HF_HUB_OFFLINE = False
    try:
        yield
    finally:
        constants.HF_HUB_OFFLINE = saved


def push_to_hub(
    folder: str | Path, repo_id: str, *, endpoint: str | None = None, private: bool = False
) -> str:
    """Create (or reuse) the data set repo ``repo_id`` and upload ``folder``; return the commit's URL."""
    from huggingface_hub import HfApi
    from huggingface_hub.errors import HfHubHTTPError

    if repo_id.count("/") != 1 or not all(repo_id.split("/")):
        raise PublishError(f"--push-to-hub needs a repo id of the form OWNER/NAME, not {repo_id!r}")
    api = HfApi(endpoint=endpoint)
    try:
        with _online():
            api.create_repo(repo_id, repo_type="dataset", private=private, exist_ok=True)
            commit = api.upload_folder(
                folder_path=str(folder),
                repo_id=repo_id,
                repo_type="dataset",
                commit_message="Publish a wasp-vllm synthetic data set",
            )
    except (HfHubHTTPError, OSError, ValueError) as exc:
        reason = " ".join(str(exc).split())[:300]
        raise PublishError(f"the push to {api.endpoint} failed ({type(exc).__name__}: {reason})") from None
    log.info("pushed %s to %s", folder, commit.commit_url)
    return str(commit.commit_url)
