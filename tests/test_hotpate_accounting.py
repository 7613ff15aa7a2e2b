"""Data-dependent accounting for Hot PATE (target charging, boundary wrapper): the constants
against brute force and hand computation, the charging behaviour of the step, the accountant's
cap, and an empirical audit of one step (which must also catch an under-noised step)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from scipy.stats import laplace

from wasp_vllm.hotpate.accounting import (
    BoundaryNoisyArgMax,
    StepOutcome,
    TargetBudgetExceeded,
    TargetChargingAccountant,
)
from wasp_vllm.hotpate.bounds import (
    boundary_q,
    composition_epsilon,
    laplace_sf,
    not_prior_q,
    plain_composition_epsilon,
    private_draws_bound,
    stability_delta,
    stability_margin,
    tct_epsilon,
    wrapper_epsilon,
)
from wasp_vllm.privacy.audit import clopper_pearson, epsilon_lower_bound

N, SCALE, MARGIN = 200, 2.0, 44.0  # threshold T = 144
T = N / 2 + MARGIN


def _hist(top: int, n: int = N) -> tuple[np.ndarray, np.ndarray]:
    """Token 7 gets ``top`` votes, the rest are spread over tokens 100.. (at most 20 each)."""
    rest = n - top
    others = [20] * (rest // 20) + ([rest % 20] if rest % 20 else [])
    tokens = np.array([7] + [100 + i for i in range(len(others))])
    return tokens, np.array([top] + others)


def _pairs(eps: float, grid: int = 300, per: int = 31):
    """Neighbouring pass probabilities (pi0, pi1) of an eps-DP test, extremes included."""
    for p0 in np.linspace(1e-5, 1 - 1e-5, grid):
        hi = min(1.0, math.exp(eps) * p0, 1 - math.exp(-eps) * (1 - p0))
        lo = max(0.0, math.exp(-eps) * p0, 1 - math.exp(eps) * (1 - p0))
        for p1 in np.linspace(lo, hi, per):
            yield p0, p1


def _wrapped(pi: float, gamma: float) -> np.ndarray:
    u = min(pi, 1 - pi)
    return np.array([(1 - gamma * u) * (1 - pi), (1 - gamma * u) * pi, gamma * u])  # ⊥, token, ⊤


def _best_q(w0: np.ndarray, w1: np.ndarray, eps_b: float, target: int) -> float:
    """Largest min_b B^b(target) over splits p C + (1-p) B^b with eps_B-close B's: the target
    entirely private, least residuals elsewhere (the construction in boundary_q's proof)."""
    big = math.exp(eps_b)
    d = np.delete(w0 - w1, target)
    r0 = np.where(d >= 0, d * big / (big - 1), -d / (big - 1))
    assert np.all(r0 <= np.delete(w0, target) + 1e-15)  # the common part stays >= 0
    mass = w0[target] + r0.sum()
    return min(w0[target], w1[target]) / mass if mass > 0 else 1.0


# ---------------------------------------------------------------------------------- constants


def test_laplace_survival_matches_scipy():
    for x in (-7.5, -1.0, 0.0, 0.3, 12.0):
        assert laplace_sf(x, 2.5) == pytest.approx(laplace.sf(x, scale=2.5), rel=1e-12)


@pytest.mark.parametrize("eps,gamma", [(0.1, 0.5), (0.5, 0.25), (0.5, 1.0), (1.0, 0.5)])
def test_boundary_target_probability_is_the_exact_worst_case(eps, gamma):
    eps_w = wrapper_epsilon(eps, gamma)
    for eps_b in (eps_w, 1.5 * eps_w):
        worst = min(_best_q(_wrapped(a, gamma), _wrapped(b, gamma), eps_b, 2) for a, b in _pairs(eps))
        claimed = boundary_q(eps, gamma, eps_b)
        assert claimed <= worst + 1e-9  # a valid q-target...
        assert worst <= claimed * 1.01  # ...and not loose
    with pytest.raises(ValueError):
        boundary_q(eps, gamma, 0.9 * eps_w)


@pytest.mark.parametrize("eps,gamma", [(0.1, 0.5), (0.5, 1.0), (0.5, 0.75), (1.0, 0.25)])
def test_wrapped_step_is_eps_w_private_and_no_better(eps, gamma):
    worst = 0.0
    for a, b in _pairs(eps, 200, 21):
        w0, w1 = _wrapped(a, gamma), _wrapped(b, gamma)
        worst = max(worst, float(np.max(np.abs(np.log(w0 / w1)))))
    assert worst <= wrapper_epsilon(eps, gamma) + 1e-9
    assert worst >= wrapper_epsilon(eps, gamma) - 0.01  # exact, up to the grid


def test_not_prior_target_probability():
    eps = 0.7
    worst = min(_best_q(np.array([1 - a, a]), np.array([1 - b, b]), eps, 1) for a, b in _pairs(eps, 200, 21))
    assert not_prior_q(eps) == pytest.approx(1 / (math.exp(0.7) + 1))
    assert not_prior_q(eps) <= worst + 1e-9 and worst == pytest.approx(not_prior_q(eps), rel=1e-3)


def test_private_draws_bound_hand_values():
    assert private_draws_bound(1, 0.5, 1e-3) == 10  # 2^-10 <= 1e-3 < 2^-9
    assert private_draws_bound(40, 1.0, 1e-9) == 40
    assert private_draws_bound(0, 0.3, 1e-6) == 0
    m = private_draws_bound(3, 0.5, 1e-4)  # Pr[Bin(m, 1/2) < 3] = (1 + m + m(m-1)/2) / 2^m
    tail = lambda k: (1 + k + k * (k - 1) / 2) / 2**k  # noqa: E731
    assert tail(m) <= 1e-4 < tail(m - 1)


def test_composition_and_tct_epsilon_hand_values():
    # eps sqrt(2k ln 1/delta) + k eps^2 / 2 = 0.1 sqrt(200 ln 1e6) + 100 * 0.01 / 2
    assert composition_epsilon(100, 0.1, 1e-6) == pytest.approx(5.7566, abs=1e-4)
    assert composition_epsilon(5, 1.0, 1e-6) == 5.0  # basic composition is smaller here
    # q = 1: every private draw is a hit, m = 100; the smallest tail share (0.05) goes to the tail
    expected = 0.1 * math.sqrt(200 * math.log(1 / 0.95e-6)) + 100 * 0.1**2 / 2
    assert tct_epsilon(100, [(1.0, 0.1)], 1e-6) == pytest.approx(expected, rel=1e-12)
    assert expected == pytest.approx(5.7663, abs=1e-4)
    # one hit, q = 1/2: m = 11 draws with the largest share 0.7 (2^-11 <= 7e-4), eps = 11 * 1
    assert tct_epsilon(1, [(0.5, 1.0)], 1e-3) == 11.0
    assert tct_epsilon(0, [(0.5, 1.0)], 1e-3) == 0.0
    # the stability failures come out of delta first
    assert tct_epsilon(100, [(1.0, 0.1)], 2e-6, delta_bad=1e-6) == pytest.approx(expected)


def test_stability_margin_inverts_stability_delta():
    margin = stability_margin(3.0, 1e-9, 0.5, votes_changed=2)
    assert stability_delta(margin, 3.0, 0.5, votes_changed=2) == pytest.approx(1e-9, rel=1e-9)


# ---------------------------------------------------------------------------------- the step


def test_unanimous_and_nothing_histograms_almost_never_charge():
    step, rng = BoundaryNoisyArgMax(SCALE, MARGIN), np.random.default_rng(1)
    unanimous, spread = (np.array([7]), np.array([N])), _hist(20)
    assert step.outcome_probabilities(*unanimous, N)["p_charge"] < 1e-12
    assert step.outcome_probabilities(*spread, N)["p_charge"] < 1e-12
    out = [step(*unanimous, N, rng) for _ in range(2000)]
    assert all(o == StepOutcome(7, False) for o in out)
    out = [step(*spread, N, rng) for _ in range(2000)]
    assert all(o == StepOutcome(None, False) for o in out)


def test_borderline_histogram_charges_with_the_analysed_probability():
    step, rng, trials = BoundaryNoisyArgMax(SCALE, MARGIN, gamma=0.5), np.random.default_rng(2), 6000
    hist = _hist(int(T))  # c_max = T: pi = 1/2, u = 1/2, charge w.p. gamma / 2
    law = step.outcome_probabilities(*hist, N)
    assert law["p_charge"] == pytest.approx(0.25) and law["p_token"] == pytest.approx(0.375)
    out = [step(*hist, N, rng) for _ in range(trials)]
    charged, tokens = sum(o.charged for o in out), sum(o.token == 7 for o in out)
    assert all(o.token is None for o in out if o.charged)
    for k, p in ((charged, 0.25), (tokens, 0.375)):
        lo, hi = clopper_pearson(k, trials, 1e-3)
        assert lo <= p <= hi


def test_not_prior_charges_exactly_the_yields():
    step, rng = BoundaryNoisyArgMax(SCALE, MARGIN, wrapper="not_prior"), np.random.default_rng(3)
    out = [step(*_hist(int(T) + 1), N, rng) for _ in range(500)]
    assert all(o.charged == (o.token is not None) for o in out)
    assert 0 < sum(o.charged for o in out) < 500


def test_neighbours_with_different_top_tokens_yield_with_at_most_delta_s():
    step = BoundaryNoisyArgMax(SCALE, MARGIN)
    tie = (np.array([5, 9]), np.array([N // 2, N // 2]))  # the top token flips with one vote
    law = step.outcome_probabilities(*tie, N)
    assert law["token"] == 5  # ties go to the lowest id
    assert law["p_token"] + law["p_charge"] <= step.delta_per_call


def test_step_rejects_inconsistent_histograms():
    step, rng = BoundaryNoisyArgMax(SCALE, MARGIN), np.random.default_rng(0)
    with pytest.raises(ValueError):
        step(np.array([1, 2]), np.array([3, 3]), 7, rng)
    with pytest.raises(ValueError):
        BoundaryNoisyArgMax(SCALE, MARGIN, gamma=0.0)
    with pytest.raises(ValueError):
        BoundaryNoisyArgMax(SCALE, MARGIN, wrapper="cold")


# ---------------------------------------------------------------------------------- accountant


def test_accountant_stops_before_the_cap_and_refuses_past_it():
    step = BoundaryNoisyArgMax(40.0, stability_margin(40.0, 1e-9, 0.5))
    acc = TargetChargingAccountant(step, epsilon=4.0, delta=1e-5, max_calls=5000)
    assert acc.max_hits >= 1
    assert acc.epsilon_for_hits(acc.max_hits) <= 4.0 < acc.epsilon_for_hits(acc.max_hits + 1)
    while acc.can_call():
        acc.record(StepOutcome(None, True))
    assert acc.hits == acc.max_hits and acc.epsilon_guaranteed() <= 4.0
    with pytest.raises(TargetBudgetExceeded):
        acc.record(StepOutcome(None, False))
    assert acc.calls == acc.max_hits  # the refused call was not recorded


def test_free_calls_only_stop_at_the_call_cap():
    step = BoundaryNoisyArgMax(40.0, stability_margin(40.0, 1e-9, 0.5))
    acc = TargetChargingAccountant(step, epsilon=4.0, delta=1e-5, max_calls=3000)
    while acc.can_call():
        acc.record(StepOutcome(7, False))
    assert acc.epsilon_plain > 4.0 and acc.calls == 3000 and acc.hits == 0 and acc.epsilon_spent() == 0.0


def test_report_states_the_guarantee_and_the_plain_comparison():
    step = BoundaryNoisyArgMax(40.0, stability_margin(40.0, 1e-9, 0.5))
    acc = TargetChargingAccountant(step, epsilon=4.0, delta=1e-5, max_calls=5000)
    for charged in [False] * 1500 + [True] * 3:
        acc.record(StepOutcome(None, charged))
    rep = json.loads(json.dumps(acc.report()))
    assert rep["epsilon_guaranteed"] <= 4.0 and rep["hits"] == 3 and rep["calls"] == 1503
    assert rep["plain_composition_epsilon_calls"] > 4.0  # 1503 calls would not fit composed
    assert rep["epsilon_at_hits_used"] < rep["epsilon_guaranteed"]
    assert "Cohen & Lyu" in rep["analysis"] and rep["wrapper"] == "boundary"
    assert plain_composition_epsilon(10, 0.1, 1e-5, 1e-5) == math.inf


def test_accountant_uses_plain_composition_when_it_fits():
    step = BoundaryNoisyArgMax(40.0, stability_margin(40.0, 1e-9), wrapper="not_prior")
    acc = TargetChargingAccountant(step, epsilon=8.0, delta=1e-5, max_calls=500)
    assert acc.max_hits == 500 and acc.epsilon_guaranteed() == acc.epsilon_plain <= 8.0
    assert acc.report()["analysis"].startswith("plain composition")


def test_accountant_rejects_a_margin_that_spends_delta():
    with pytest.raises(ValueError):
        TargetChargingAccountant(BoundaryNoisyArgMax(SCALE, 5.0), epsilon=8.0, delta=1e-5, max_calls=100)


# ---------------------------------------------------------------------------------- audit


def _audit(true_scale: float, trials: int = 12000) -> float:
    """Lower bound on one step's epsilon from neighbours D (top count T) and D' (one of those
    teachers votes elsewhere), scoring ⊥ = 0, ⊤ = 1, token = 2."""
    step = BoundaryNoisyArgMax(true_scale, MARGIN, gamma=0.5)
    with_vote, without = _hist(int(T)), _hist(int(T) - 1)
    score = {None: 0.0, 7: 2.0}

    def run(hist: tuple[np.ndarray, np.ndarray], seed: int) -> np.ndarray:
        rng = np.random.default_rng([11, seed])
        out = (step(*hist, N, rng) for _ in range(trials))
        return np.array([1.0 if o.charged else score[o.token] for o in out])

    return epsilon_lower_bound(run(with_vote, 1), run(without, 2), delta=1e-6).epsilon_lower_bound


def test_one_step_is_no_more_distinguishable_than_claimed():
    claimed = BoundaryNoisyArgMax(SCALE, MARGIN, gamma=0.5).eps_step
    assert _audit(SCALE) < claimed


def test_the_audit_catches_an_eighth_of_the_noise():
    claimed = BoundaryNoisyArgMax(SCALE, MARGIN, gamma=0.5).eps_step
    assert _audit(SCALE / 8) > claimed
