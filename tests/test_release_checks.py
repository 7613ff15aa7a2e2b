"""A release that the noise-vs-sigma test of the votes does not cover (issue 21, item 10): the
private label prior's noise (a curated mutant in tests/test_mutants.py)."""

from __future__ import annotations

import numpy as np
import pytest

from tests.test_levers import run
from wasp_vllm.config import RunConfig
from wasp_vllm.pipeline.context import privacy_plan
from wasp_vllm.privacy.accountant import PrivacyBudgetExceeded, PrivacyLedger
from wasp_vllm.privacy.mechanisms import clean_label_counts, release_label_histogram
from wasp_vllm.privacy.plan import plan_privacy
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
    expected = plan_privacy(cfg.epsilon, cfg.delta, cfg.rounds, cfg.q, prior_share=cfg.label_prior_share)
    assert prior_sigma == pytest.approx(expected.prior_sigma) and prior_sigma in ledger["sigmas"]


def test_an_overspending_split_is_refused_for_what_it_is(monkeypatch):
    import wasp_vllm.privacy.plan as plan_module

    real = plan_module._prior

    def greedy_prior(*args):  # the prior takes twice the noise-free share it was given
        sigma, sensitivity, votes_epsilon = real(*args)
        return sigma / 2, sensitivity, votes_epsilon

    monkeypatch.setattr(plan_module, "_prior", greedy_prior)
    with pytest.raises(PrivacyBudgetExceeded, match="label prior") as refused:
        plan_privacy(4.0, 1e-5, 5, 8, prior_share=0.1)
    assert "paper" not in str(refused.value)
