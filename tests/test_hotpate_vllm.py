"""Hot PATE teachers on vLLM against the exact transformers path, on the packaged SmolLM2.

Slow: loads the model twice (transformers, and vLLM - vllm-cpu here).  Both run in fp32 so the
comparison measures the method (top-K log-probabilities, prompt re-submission with the prefix
cache, the "no token" bin), not bf16 rounding.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

pytestmark = pytest.mark.slow

PROMPTS = [
    "Pick a number between 1 and 10:",
    "Here are some colours: red, green, blue, yellow and purple. Name one more colour:",
    "Hi",
]
TOP_K = 20


@pytest.fixture(scope="module")
def approx():
    """The teachers on vLLM; the exact ones come from the float32 transformers SmolLM2 that
    test_hotpate.py's slow test used too (conftest's ``smollm2_fp32``)."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("vllm")
    from wasp_vllm.hotpate.vllm_teachers import VLLMTeacherSource, load_vllm

    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    loaded = load_vllm("smollm2", dtype="float32", max_model_len=512, max_logprobs=TOP_K)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield VLLMTeacherSource(loaded, PROMPTS, top_k=TOP_K)
    finally:
        torch.set_num_threads(threads)
        engine = getattr(loaded.llm, "llm_engine", None)
        shutdown = getattr(engine, "shutdown", None) or getattr(
            getattr(engine, "engine_core", None), "shutdown", None
        )
        if callable(shutdown):
            shutdown()


def _compare(exact_row: np.ndarray, approx_row: np.ndarray, no_token: int) -> None:
    top = np.flatnonzero(approx_row[:no_token])
    assert top.size == TOP_K
    assert set(top) <= set(np.argsort(-exact_row)[: TOP_K + 3])  # the same top-K, up to ties at the edge
    assert np.abs(approx_row[top] - exact_row[top]).max() < 2e-3  # the same probabilities
    assert approx_row[no_token] == pytest.approx(1.0 - approx_row[top].sum(), abs=1e-12)  # the bin
    assert approx_row[no_token] == pytest.approx(1.0 - exact_row[top].sum(), abs=5e-3)  # the true tail


def test_vllm_top_k_and_no_token_bin_match_the_exact_distributions(approx, smollm2_fp32):
    from wasp_vllm.hotpate import TeacherEnsembleLM

    exact = TeacherEnsembleLM(smollm2_fp32, PROMPTS)
    assert approx.vocab_size == exact.vocab_size + 1 and approx.no_token_id == exact.vocab_size
    steps = [approx.encode(" Sure")[0], approx.encode(" 7")[0]]
    for step in range(len(steps) + 1):
        e, a = exact.next_distributions(), approx.next_distributions()
        assert a.shape == (len(PROMPTS), approx.vocab_size) and np.allclose(a.sum(axis=1), 1.0)
        for row in range(len(PROMPTS)):
            _compare(e[row], a[row], approx.no_token_id)
        if step < len(steps):  # the same public token for every teacher; vLLM re-submits prompt + tokens
            exact.append(steps[step])
            approx.append(steps[step])
    with pytest.raises(ValueError):
        approx.append(approx.no_token_id)  # the bin is never a token


def test_a_record_on_vllm_teachers_never_returns_the_no_token_bin(approx):
    from wasp_vllm.hotpate import HomogeneousAggregator, PrivateTokenSelector, generate_record

    sel = PrivateTokenSelector(HomogeneousAggregator(0.0, threshold=1.5), rng=np.random.default_rng(0))
    out = generate_record(approx, sel, max_tokens=4)
    assert out.tokens and all(0 <= t < approx.no_token_id for t in out.tokens)
    assert out.private + out.fallback == len(out.tokens) + (out.end == "eos")
