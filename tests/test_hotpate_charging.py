"""Hot PATE in the generator, both accountings: budgets per label, the teachers' sizing from the
public M, the hand-over to the public fallback, the "no token" bin, the report's guarantee, and an
empirical audit of one whole token decision under target charging."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from tests.test_hotpate import CANARY, StubSource, _private_set
from wasp_vllm.hotpate import HomogeneousAggregator, PrivateTokenSelector, generate_record, run_hotpate
from wasp_vllm.hotpate.accounting import BoundaryNoisyArgMax
from wasp_vllm.hotpate.prompts import build_teacher_prompts
from wasp_vllm.hotpate.settings import HotPateSettings
from wasp_vllm.hotpate.steps import (
    ChargedStep,
    charged_step,
    gaussian_release_cap,
    gaussian_sigma,
    label_budget,
)
from wasp_vllm.privacy.accountant import ExactAccountant, GaussianRelease
from wasp_vllm.privacy.audit import epsilon_lower_bound
from wasp_vllm.privacy.gaussian import epsilon_for_sigma


def _stub_factory(seen: list[int] | None = None):
    def factory(prompts: list[str]) -> StubSource:
        if seen is not None:
            seen.append(len(prompts))
        return StubSource(prompts)

    return factory


# ------------------------------------------------------------------------------ budgets, sizing


def test_label_budgets_compose_to_the_run_budget():
    assert label_budget("gaussian", "add_remove", 4.0, 1e-5).sensitivity == pytest.approx(math.sqrt(2))
    rep = label_budget("gaussian", "replace", 4.0, 1e-5)
    # two teachers of one ensemble both moving x -> y: (-2, +2), norm 2 sqrt 2 (issue 21)
    assert (rep.epsilon, rep.delta) == (4.0, 1e-5) and rep.sensitivity == pytest.approx(2 * math.sqrt(2))
    tct = label_budget("target-charging", "replace", 4.0, 1e-5)
    assert (tct.epsilon, tct.delta, tct.votes_changed) == (2.0, 5e-6, 2)
    # replace across two labels: K releases at sqrt 2 in each spend less than K at 2 sqrt 2 in one
    sigma, k = 3.0, 7
    two = [GaussianRelease(i, sigma, math.sqrt(2), "replace") for i in range(2 * k)]
    one = [GaussianRelease(i, sigma, rep.sensitivity, "replace") for i in range(k)]
    assert ExactAccountant().epsilon(two, 1e-5) < ExactAccountant().epsilon(one, 1e-5)


def test_noise_from_the_threshold_fraction_and_the_release_cap():
    n, vocab = 67, 49152
    sigma = gaussian_sigma(n, vocab, 0.8, 1e-3)
    assert HomogeneousAggregator(sigma).resolve_threshold(n, vocab) == pytest.approx(0.8 * n)
    cap = gaussian_release_cap(sigma, 2.0, 4.0, 1e-5)
    assert epsilon_for_sigma(sigma, 1e-5, 2.0, cap) <= 4.0 < epsilon_for_sigma(sigma, 1e-5, 2.0, cap + 1)
    step = charged_step(200, label_budget("target-charging", "add_remove", 8.0, 1e-5), 1000, 0.8)
    assert step.mechanism.threshold(200) == pytest.approx(160.0)
    assert step.accountant is not None and step.accountant.delta_bad == pytest.approx(0.1 * 1e-5)


def test_teachers_per_label_follow_the_public_m_never_the_label_counts():
    s = HotPateSettings(n_samples=4, epsilon=1.0, delta=1e-5, requested_m=600, records_per_teacher=3)
    assert s.teachers_per_label(3) == 67 and s.examples_shown() == 6
    assert HotPateSettings(n_samples=1, epsilon=1, delta=1e-5, teachers=5).teachers_per_label(3) == 5
    with pytest.raises(ValueError, match="public M"):
        HotPateSettings(n_samples=1, epsilon=1, delta=1e-5).teachers_per_label(3)
    seen: list[list[int]] = []
    for per_label in (5, 40):  # very different private label counts: the same ensembles
        texts, labels = _private_set(per_label)
        seen.append([])
        run_hotpate(texts, labels, ["good", "bad"], n_samples=2, epsilon=2.0, delta=1e-5, requested_m=60,
                    records_per_teacher=3, max_tokens=3, source_factory=_stub_factory(seen[-1]))  # fmt: skip
    assert seen[0] == seen[1] == [1, 10, 1, 10]  # the public prompt alone, then ceil(60 / 6) teachers


def test_an_empty_teacher_gets_the_public_prompt():
    prompts = build_teacher_prompts([f"r{i} {CANARY}" for i in range(3)], 10, "good", 0, 3)
    assert sum(p == prompts[-1] for p in prompts[:-1]) >= 7 and CANARY not in prompts[-1]


# ------------------------------------------------------------------------------ the generator


def test_a_spent_budget_hands_over_to_the_fallback_and_every_record_is_written():
    texts, labels = _private_set()
    table, report = run_hotpate(
        texts, labels, ["good", "bad"], teachers=16, max_tokens=6, n_samples=20,
        epsilon=20.0, delta=1e-5, seed=0, sigma=2.0, threshold=4.0,
        source_factory=lambda prompts: StubSource(prompts),
    )  # fmt: skip
    assert report.budget_exhausted and report.tokens_fallback_by_reason["budget"] > 0
    assert report.records_written == table.num_rows == 20  # never stops at a few of 20
    assert len(report.tokens_per_record) == 20 and report.tokens_private > 0
    assert sum(p for p, _ in report.tokens_per_record) == report.tokens_private
    assert sum(p + f for p, f in report.tokens_per_record) == report.tokens_private + report.tokens_fallback
    # one ledger per label (disjoint ensembles): each used its whole cap, and one more would exceed
    from wasp_vllm.privacy.gaussian import epsilon_for_sigma

    for label in ("good", "bad"):
        calls = report.labels[label]["calls"]
        assert calls == report.labels[label]["releases_cap"] > 0
        assert (
            epsilon_for_sigma(2.0, 1e-5, math.sqrt(2), calls)
            <= 20.0
            < epsilon_for_sigma(2.0, 1e-5, math.sqrt(2), calls + 1)
        )
    assert report.guarantee["epsilon"] <= 20.0 and report.plain_composition["epsilon"] <= 20.0


def test_target_charging_at_the_packaged_scale_makes_no_call_and_still_writes_every_record():
    texts, labels = _private_set()
    table, rep = run_hotpate(texts, labels, ["good", "bad"], n_samples=6, epsilon=8.0, delta=1e-5,
                             teachers=67, max_tokens=5, accounting="target-charging",
                             neighbour="replace", source_factory=_stub_factory())  # fmt: skip
    assert table.num_rows == rep.records_written == 6
    assert rep.tokens_private == 0 and rep.plain_composition["queries"] == 0
    assert rep.labels["good"]["max_hits"] == 0 and rep.epsilon_guaranteed == 0.0
    assert rep.tokens_fallback_by_reason["budget"] == rep.tokens_fallback > 0


def test_target_charging_pays_for_yields_not_for_queries():
    texts, labels = _private_set()
    table, rep = run_hotpate(texts, labels, ["good", "bad"], n_samples=80, epsilon=2.0, delta=1e-5,
                             teachers=2000, max_tokens=10, accounting="target-charging", seed=3,
                             source_factory=_stub_factory(), noise_rng=np.random.default_rng(4))  # fmt: skip
    assert table.num_rows == 80 and rep.private_token_share > 0.95  # near-unanimous teachers
    for label in ("good", "bad"):
        acc = rep.labels[label]
        assert acc["hits"] <= acc["max_hits"] and acc["calls"] <= acc["max_calls"]
    guaranteed, plain = rep.guarantee["epsilon"], rep.plain_composition["epsilon"]
    assert guaranteed <= 2.0 < plain  # composing every query of this very run would not fit
    assert rep.plain_composition["queries"] == sum(rep.labels[x]["calls"] for x in ("good", "bad"))
    assert "Cohen & Lyu" in rep.guarantee["statement"] and "parallel" in rep.guarantee["statement"]
    json.dumps(rep.to_json())  # the manifest entry is JSON


def test_replace_target_charging_adds_two_labels():
    texts, labels = _private_set()
    _, rep = run_hotpate(texts, labels, ["good", "bad"], n_samples=20, epsilon=8.0, delta=1e-5,
                         teachers=3000, max_tokens=4, accounting="target-charging", neighbour="replace",
                         source_factory=_stub_factory())  # fmt: skip
    per = rep.guarantee["per_label_epsilon"]
    assert rep.guarantee["epsilon"] == pytest.approx(sum(per.values()))
    assert rep.guarantee["epsilon"] <= 8.0
    assert rep.guarantee["delta"] == pytest.approx(1e-5) and rep.guarantee["per_label_budget"]["epsilon"] == 4


def test_after_the_budget_the_public_prompt_alone_generates():
    texts, labels = _private_set()
    seen: list[int] = []
    table, rep = run_hotpate(texts, labels, ["good", "bad"], n_samples=10, epsilon=2.0, delta=1e-5,
                             teachers=16, max_tokens=6, sigma=2.0, threshold=4.0,
                             source_factory=_stub_factory(seen))  # fmt: skip
    assert seen == [1, 16, 1, 16] and table.num_rows == 10 and rep.budget_exhausted
    assert rep.tokens_fallback_by_reason["budget"] > 0


def test_the_no_token_bin_is_never_returned_nor_sampled():
    vocab = 6  # id 5 is the "no token" bin
    teachers = np.zeros((30, vocab))
    teachers[:, 5] = 1.0  # every teacher votes "no token"
    public = np.array([0.0, 0.1, 0.0, 0.0, 0.0, 0.9])
    sel = PrivateTokenSelector(HomogeneousAggregator(0.0, threshold=1), rng=np.random.default_rng(0))
    decisions = [sel.select(teachers, public, [], no_token=5) for _ in range(50)]
    assert {d.token for d in decisions} == {1} and {d.source for d in decisions} == {"abstain"}


def test_target_charging_noise_comes_from_the_secret_stream():
    probs = np.tile(np.eye(4)[0], (100, 1))
    probs[:60] = np.eye(4)[1]  # 60 of 100 on token 1: borderline for T = 60

    def tokens(noise_seed: int) -> list[str]:
        step = ChargedStep(BoundaryNoisyArgMax(2.0, 10.0))
        sel = PrivateTokenSelector(step, max_retries=0, rng=np.random.default_rng(0),
                                   noise_rng=np.random.default_rng(noise_seed))  # fmt: skip
        return [sel.select(probs, probs[0], []).source for _ in range(40)]

    assert tokens(1) == tokens(1) and tokens(1) != tokens(2)


def test_generate_record_counts_every_decision():
    source = StubSource(["a", "b", "c", "public"])
    sel = PrivateTokenSelector(HomogeneousAggregator(0.0, threshold=2), rng=np.random.default_rng(1))
    out = generate_record(source, sel, max_tokens=8)
    assert out.private + out.fallback == len(out.tokens) + (out.end == "eos")


# ------------------------------------------------------------------------------ audit


class _CountingStep(ChargedStep):
    """The target-charged step with its charged calls counted (published as the label's hits)."""

    hits = 0

    def settle(self, outcome) -> None:
        super().settle(outcome)
        self.hits += int(outcome.charged)


def _selector_audit(scale: float, claimed_scale: float, trials: int = 6000) -> tuple[float, float]:
    """Lower bound on one token decision's epsilon (up to 3 target-charged calls on fresh draws)
    from neighbouring ensembles: D has 144 of 200 teachers on token 1 (T = 144), D' one fewer.
    The score sees everything published about the decision: the token, its calls and charges."""
    n, margin = 200, 44.0

    def run(on_token: int, seed: int) -> np.ndarray:
        probs = np.tile(np.eye(8)[0], (n, 1))
        probs[:on_token] = np.eye(8)[1]
        step = _CountingStep(BoundaryNoisyArgMax(scale, margin, gamma=0.5))
        rng, noise_rng = np.random.default_rng([5, seed]), np.random.default_rng([6, seed])
        sel = PrivateTokenSelector(step, fallback=lambda p, t, r: 0, rng=rng, noise_rng=noise_rng)
        scores = []
        for _ in range(trials):
            hits = step.hits
            d = sel.select(probs, probs[0], [])
            scores.append(2.0 * (d.source == "private") + (step.hits - hits) / 4.0 - d.releases / 16.0)
        return np.asarray(scores)

    bound = epsilon_lower_bound(run(144, 1), run(143, 2), delta=1e-6).epsilon_lower_bound
    return bound, 3 * BoundaryNoisyArgMax(claimed_scale, margin, gamma=0.5).eps_step  # basic composition


def test_one_token_decision_is_no_more_distinguishable_than_claimed():
    bound, claimed = _selector_audit(2.0, 2.0)
    assert bound < claimed


def test_the_decision_audit_catches_an_under_noised_step():
    bound, claimed = _selector_audit(2.0 / 16, 2.0)
    assert bound > claimed
