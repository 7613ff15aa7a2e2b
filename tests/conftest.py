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


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """The machine the suite ran on, at the end of the log where CI shows it: the machines that run
    it differ (AVX2-only CPUs, CPUs with AMX), and with them the PLMs' number type and the time the
    real-engine tests take."""
    import os

    from wasp_vllm.engines.devices import cpu_has_native_bf16, cpu_model, model_dtype, torch_device

    bf16 = "native bf16" if cpu_has_native_bf16() else "no native bf16"
    terminalreporter.write_line(
        f"machine: {cpu_model()}, {os.cpu_count()} cores, {bf16}; {torch_device()}; PLMs in {model_dtype()}"
    )
