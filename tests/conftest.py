"""Fixtures shared by the test modules."""

from __future__ import annotations

import pytest

from wasp_vllm.engines.embedder import Embedder


@pytest.fixture(scope="session")
def embedder() -> Embedder:
    """The real packaged sentence embedder (all-MiniLM-L6-v2), loaded once per test session."""
    return Embedder("auto", device="cpu")


@pytest.fixture(autouse=True, scope="session")
def _owner_home(tmp_path_factory: pytest.TempPathFactory) -> None:
    """The owner's secrets (fingerprint key) in a scratch folder, never the real home."""
    import os

    os.environ["WASP_VLLM_HOME"] = str(tmp_path_factory.mktemp("owner-home"))
