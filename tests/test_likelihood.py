"""--min-sample-logprob / --max-sample-logprob: samples judged by their own PLM's log-probabilities.

Unit tests of the pure logic on a fake engine (named as such); the real engines' log-probabilities
are checked against a teacher-forced forward pass in tests/test_engines_real.py."""

from __future__ import annotations

import pytest

import wasp_vllm
from tests.fakes import RewritingFakeEngineForUnitTests, use_fake_backends
from wasp_vllm.config import ConfigError, RunConfig, build_config
from wasp_vllm.engines.base import Completion
from wasp_vllm.pipeline import PipelineError
from wasp_vllm.pipeline.generation import likelihood_reject

SMALL = dict(plms=["a", "b"], n=36, rounds=3, q=2, s=2)


@pytest.mark.parametrize(
    ("value", "low", "high", "expected"),
    [
        (-2.5, None, None, None),
        (None, None, None, None),  # not asked: whatever the engine returned
        (-4.0, -3.5, None, "unlikely"),
        (-3.5, -3.5, None, None),  # the bound itself is kept
        (-0.5, None, -1.25, "predictable"),
        (-1.25, None, -1.25, None),
        (-2.0, -3.5, -1.25, None),
        (-0.1, -3.5, -1.25, "predictable"),
    ],
)
def test_likelihood_reject(value, low, high, expected):
    assert likelihood_reject(Completion("text", 5, value), "a", low, high) == expected


def test_an_engine_without_logprobs_is_a_clear_error():
    with pytest.raises(PipelineError, match="PLM a: its engine returned no log-probabilities"):
        likelihood_reject(Completion("text", 5, None), "a", None, -1.0)


def test_bounds_must_leave_room():
    with pytest.raises(ConfigError, match="min_sample_logprob=-1.0 is not below max_sample_logprob=-2.0"):
        build_config({}, {"min_sample_logprob": -1.0, "max_sample_logprob": -2.0})
    with pytest.raises(ConfigError, match="max_sample_logprob"):
        build_config({}, {"max_sample_logprob": 0.5})  # a log-probability is at most 0


class LoopEveryThird(RewritingFakeEngineForUnitTests):
    """FAKE engine for unit tests: every third sample is a loop its 'model' finds near-certain
    (mean log-probability -0.2 per token), the others read at -2.5; log-probabilities only when
    asked, as the real engines do."""

    def rewrite(self, completion, params):
        loop = self.count % 3 == 0
        # the loop keeps the asked label's words, so the label check keeps it too
        text = f"loop {self.count} " + "again " * 8 + completion.text if loop else completion.text
        value = (-0.2 if loop else -2.5) if params.logprobs else None
        return Completion(text, completion.n_tokens, value)


def test_predictable_samples_are_regenerated_not_kept(tmp_path, monkeypatch):
    engines = use_fake_backends(monkeypatch, {"a": LoopEveryThird("a"), "b": LoopEveryThird("b")})
    result = wasp_vllm.generate(**SMALL, max_sample_logprob=-1.25, out=tmp_path / "run")
    texts = result.to_arrow().column("text").to_pylist()
    assert len(texts) == 36  # still exactly N rows
    assert not any(t.startswith("loop") for t in texts)
    manifest = result.manifest.to_json()
    assert all(manifest["work"][p]["generated"] > manifest["work"][p]["kept"] for p in ("a", "b"))
    reasons = {r for record in manifest["rounds"] for plm in record["rejects"].values() for r in plm}
    assert reasons == {"predictable"}
    assert all(p.logprobs for e in engines.values() for p in e.params)


def test_off_by_default_and_engines_are_not_asked(tmp_path, monkeypatch):
    engines = use_fake_backends(monkeypatch, {"a": LoopEveryThird("a"), "b": LoopEveryThird("b")})
    result = wasp_vllm.generate(**SMALL, out=tmp_path / "run")
    assert sum(t.startswith("loop") for t in result.to_arrow().column("text").to_pylist()) >= 6
    assert not any(p.logprobs for e in engines.values() for p in e.params)
    assert RunConfig().min_sample_logprob is None and RunConfig().max_sample_logprob is None
