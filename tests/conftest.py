"""Fixtures shared by the test modules."""

from __future__ import annotations

import pytest

from wasp_vllm.embed import Embedder


@pytest.fixture(scope="session")
def embedder() -> Embedder:
    """The real packaged sentence embedder (all-MiniLM-L6-v2), loaded once per test session."""
    return Embedder("auto", device="cpu")
