"""Releases that the noise-vs-sigma test of the votes does not cover (issue 21, item 10): the
private label prior's noise (a curated mutant in tests/test_mutants.py); a vote after a round that
kept nothing (issue 73, item 5)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pyarrow.parquet as pq
import pytest

from tests.fakes import FakeEngineForUnitTests, HashEmbedderForTests
from tests.test_levers import run
from tests.test_reliability import settings, write_private
from wasp_vllm.config import RunConfig
from wasp_vllm.engines import Completion
from wasp_vllm.pipeline import Run, prepare
from wasp_vllm.pipeline.context import privacy_plan
from wasp_vllm.privacy.accountant import PrivacyBudgetExceeded, PrivacyLedger
from wasp_vllm.privacy.mechanisms import clean_label_counts, release_label_histogram
from wasp_vllm.privacy.plan import BudgetShares, plan_privacy
from wasp_vllm.privacy.secrets import RunSecret


@pytest.mark.parametrize("m", [None, 100])
def test_the_label_priors_noise_is_the_sigma_the_plan_and_ledger_record(m):
    cfg = RunConfig(label_prior="private", private_limit=m)
    plan = privacy_plan(cfg)
    assert plan.prior_sigma is not None
    rng = np.random.default_rng(0)
    n_labels = 4000  # many labels: the residuals' spread is known to about 2 %
    labels = rng.integers(0, n_labels, 20_000)
    ledger = PrivacyLedger(plan.epsilon, plan.delta)
    noisy = release_label_histogram(labels, n_labels, plan, RunSecret.generate(), ledger)
    residual = noisy - clean_label_counts(labels, n_labels)
    assert abs(residual.std() / plan.prior_sigma - 1) < 0.08
    assert abs(residual.mean()) < 4 * plan.prior_sigma / np.sqrt(n_labels)
    (release,) = ledger.releases
    assert release.what == "label-prior" and release.sigma == plan.prior_sigma


def test_a_run_publishes_the_prior_sigma_it_planned(tmp_path):
    cfg, manifest, _ = run(tmp_path, label_prior="private")
    ledger = manifest["privacy"]["ledger"]
    prior_sigma = manifest["privacy"]["plan"]["prior_sigma"]
    expected = plan_privacy(
        cfg.epsilon, cfg.delta, cfg.rounds, cfg.q, shares=BudgetShares(label_prior=cfg.label_prior_share)
    )
    assert prior_sigma == pytest.approx(expected.prior_sigma) and prior_sigma in ledger["sigmas"]


def test_an_overspending_split_is_refused_for_what_it_is(monkeypatch):
    import wasp_vllm.privacy.plan as plan_module

    real = plan_module._side_releases

    def greedy_prior(*args):  # the prior takes twice the noise-free share it was given
        side = real(*args)
        sigma, sensitivity = side.prior
        return dataclasses.replace(side, prior=(sigma / 2, sensitivity))

    monkeypatch.setattr(plan_module, "_side_releases", greedy_prior)
    with pytest.raises(PrivacyBudgetExceeded, match="label prior") as refused:
        plan_privacy(4.0, 1e-5, 5, 8, shares=BudgetShares(label_prior=0.1))
    assert "paper" not in str(refused.value)


class SilentOnExamplesForTests(FakeEngineForUnitTests):
    """FAKE engine for unit tests: writes nothing usable once its prompts show examples (every
    sample it wrote ends 'and more'), so every round after round 0 keeps nothing."""

    def generate(self, prompts, seeds, params):
        out = super().generate(prompts, seeds, params)
        return [Completion("  ", 1) if "and more" in p else c for p, c in zip(prompts, out, strict=True)]


def test_a_round_that_keeps_nothing_is_still_voted_on_and_paid_for(tmp_path):
    """After round 1 the samples so far are round 0's alone, as after round 0: the records vote on
    them again, with fresh noise, and the ledger charges that vote like any other (every noisy
    votes file the run keeps has its release in the ledger)."""
    private = write_private(tmp_path / "p.csv", n=24)
    cfg = RunConfig(**settings(private, plms=["a"], n=36, rounds=3))
    factory = {"a": SilentOnExamplesForTests("a")}
    manifest = Run(prepare(cfg), tmp_path / "out", engine_factory=lambda name, c: factory[name],
                   embedder=HashEmbedderForTests()).execute().to_json()  # fmt: skip
    kept = [sum(r["kept"].values()) for r in manifest["rounds"]]
    assert kept[0] > 0 and kept[1] == 0 == kept[2]
    votes = sorted((tmp_path / "out").rglob("votes-*.parquet"))
    ledger = manifest["privacy"]["ledger"]
    assert [v.name for v in votes] == ["votes-000.parquet", "votes-001.parquet"]
    assert ledger["compositions"] == len(votes) == 2 and ledger["rounds"] == [0, 1]
    first, second = (pq.read_table(v) for v in votes)
    assert first.column("id").equals(second.column("id"))  # the same samples ...
    assert not np.allclose(
        first.column("h_near").to_numpy(), second.column("h_near").to_numpy()
    )  # ... re-noised
