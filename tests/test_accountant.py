"""Privacy accountant: reference table, independent accountants, inverses, plan and ledger."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest

from wasp_vllm.privacy.accountant import (
    ExactAccountant,
    GaussianRelease,
    PaperAccountant,
    PrivacyBudgetExceeded,
    PrivacyLedger,
    PrivacyUnit,
    paper_epsilon,
    paper_sigma,
    wasp_sensitivity,
)
from wasp_vllm.privacy.gaussian import (
    calibrate_sigma,
    delta_for_epsilon_mu,
    epsilon_for_mu,
    epsilon_for_sigma,
    mu_for_epsilon,
)
from wasp_vllm.privacy.plan import VoteShape, plan_privacy
from wasp_vllm.privacy.report import LedgerReport

# --- the reference table of DESIGN.md (delta = 1e-5, T = 5, Q = 8) ------------------------------

REFERENCE = [  # epsilon, paper sigma, exact add/remove sigma, exact replace sigma
    (1.0, 38.758, 12.184, 17.231),
    (4.0, 9.690, 3.531, 4.994),
    (8.0, 4.845, 1.960, 2.772),
]


@pytest.mark.parametrize(("eps", "paper", "add_remove", "replace"), REFERENCE)
def test_reference_table(eps, paper, add_remove, replace):
    assert round(paper_sigma(eps, 1e-5, 5), 3) == paper
    assert round(calibrate_sigma(eps, 1e-5, wasp_sensitivity(8), 4), 3) == add_remove
    assert round(calibrate_sigma(eps, 1e-5, wasp_sensitivity(8, "replace"), 4), 3) == replace
    assert round(plan_privacy(eps, 1e-5, 5, 8).sigma, 3) == add_remove
    assert round(plan_privacy(eps, 1e-5, 5, 8, unit=PrivacyUnit("replace")).sigma, 3) == replace
    assert round(plan_privacy(eps, 1e-5, 5, 8, mode="paper").sigma, 3) == paper


# --- sensitivity ------------------------------------------------------------------------------------


def test_sensitivity_formula():
    for q in (1, 2, 8, 30):
        assert math.isclose(wasp_sensitivity(q), math.sqrt(8 / 3 * (1 - 4.0**-q)), rel_tol=1e-15)
        assert math.isclose(wasp_sensitivity(q, "replace"), math.sqrt(2) * wasp_sensitivity(q), rel_tol=1e-15)
        assert math.isclose(wasp_sensitivity(q, records_per_unit=3), 3 * wasp_sensitivity(q), rel_tol=1e-15)
    assert wasp_sensitivity(1) == pytest.approx(math.sqrt(2))
    assert wasp_sensitivity(1) < wasp_sensitivity(2) < wasp_sensitivity(20) < math.sqrt(8 / 3)


@pytest.mark.parametrize(
    "kwargs",
    [dict(q=0), dict(q=1.5), dict(q=True), dict(q=8, neighbour="swap"), dict(q=8, records_per_unit=0)],
)
def test_sensitivity_validation(kwargs):
    with pytest.raises(ValueError):
        wasp_sensitivity(**kwargs)


# --- agreement with dp_accounting -----------------------------------------------------------------

# epsilon, delta, sensitivity, compositions
DP_CASES = [
    (1.0, 1e-5, wasp_sensitivity(8), 4),
    (4.0, 1e-5, wasp_sensitivity(8, "replace"), 4),
    (8.0, 1e-5, wasp_sensitivity(8), 4),
    (0.1, 1e-6, 1.0, 1),
    (0.5, 1e-8, wasp_sensitivity(4), 9),
    (2.0, 1e-3, wasp_sensitivity(2, records_per_unit=3), 2),
    (20.0, 1e-10, 1.0, 1),
    (0.01, 1e-12, 1.0, 3),
]


@pytest.mark.parametrize(("eps", "delta", "sens", "k"), DP_CASES)
def test_sigma_agrees_with_dp_accounting(eps, delta, sens, k):
    common = pytest.importorskip("dp_accounting.pld.common")
    pld_accountant = pytest.importorskip("dp_accounting.pld.accountant")
    mechanism = pytest.importorskip("dp_accounting.pld.privacy_loss_mechanism")
    sigma = calibrate_sigma(eps, delta, sens, k)
    params = common.DifferentialPrivacyParameters(eps, delta)
    theirs = pld_accountant.get_smallest_gaussian_noise(params, k, sens)
    assert sigma == pytest.approx(theirs, rel=1e-6)
    # their closed-form hockey-stick divergence at our sigma is exactly the target delta
    loss = mechanism.GaussianPrivacyLoss(sigma, sensitivity=sens * math.sqrt(k))
    assert loss.get_delta_for_epsilon(eps) == pytest.approx(delta, rel=1e-6)
    assert loss.get_delta_for_epsilon(eps) <= delta * (1 + 1e-9)  # never too little noise


@pytest.mark.parametrize(("eps", "delta", "sens", "k"), [c for c in DP_CASES if c[1] >= 1e-10])
def test_epsilon_agrees_with_pld_accountant(eps, delta, sens, k):
    """The PLD accountant composes the k Gaussian events itself; its epsilon must match ours.

    Its privacy-loss grid (spacing 1e-3) holds every epsilon of DP_CASES, where it is precise; off
    the grid it rounds epsilon up by less than one spacing.
    """
    dp_event = pytest.importorskip("dp_accounting.dp_event")
    pld_mod = pytest.importorskip("dp_accounting.pld.pld_privacy_accountant")
    for factor, rel, slack in ((1.0, 1e-6, 0.0), (1.1, 0.0, 1e-3)):
        sigma = calibrate_sigma(eps, delta, sens, k) * factor
        accountant = pld_mod.PLDAccountant(value_discretization_interval=1e-3)
        accountant.compose(dp_event.GaussianDpEvent(sigma / sens), k)
        theirs, ours = accountant.get_epsilon(delta), epsilon_for_sigma(sigma, delta, sens, k)
        if rel:
            assert ours == pytest.approx(theirs, rel=rel)
        else:
            assert ours * (1 - 1e-9) <= theirs <= ours + slack


def test_heterogeneous_ledger_agrees_with_pld_accountant():
    dp_event = pytest.importorskip("dp_accounting.dp_event")
    pld_mod = pytest.importorskip("dp_accounting.pld.pld_privacy_accountant")
    sens = wasp_sensitivity(8)
    ledger = PrivacyLedger(epsilon=10.0, delta=1e-5)
    accountant = pld_mod.PLDAccountant(value_discretization_interval=1e-3)
    for rnd, sigma in enumerate([3.0, 5.0, 4.0]):
        ledger.record(GaussianRelease(rnd, sigma, sens, "add_remove"))
        accountant.compose(dp_event.GaussianDpEvent(sigma / sens))
    # three different discretised PLDs are composed on their side: pessimistic by < 3 grid steps
    theirs = accountant.get_epsilon(1e-5)
    assert ledger.spent_epsilon() * (1 - 1e-9) <= theirs <= ledger.spent_epsilon() + 3e-3


def test_analytic_gaussian_against_high_precision():
    mp = pytest.importorskip("mpmath")
    mp.mp.dps = 40
    worst = 0.0
    for eps in (0.01, 0.3, 1.0, 10.0, 100.0):
        for delta in (1e-12, 1e-7, 1e-3, 0.5):
            mu = mu_for_epsilon(eps, delta)
            m, e = mp.mpf(mu), mp.mpf(eps)
            exact = mp.ncdf(m / 2 - e / m) - mp.e**e * mp.ncdf(-m / 2 - e / m)
            worst = max(worst, abs(float(exact / delta) - 1), abs(delta_for_epsilon_mu(eps, mu) / delta - 1))
    assert worst < 1e-9


# --- inverses and monotonicity --------------------------------------------------------------------


@pytest.mark.parametrize("eps", [0.01, 0.1, 1.0, 4.0, 25.0, 100.0])
@pytest.mark.parametrize("delta", [1e-12, 1e-8, 1e-5, 0.01, 0.5])
def test_round_trip(eps, delta):
    sens, k = wasp_sensitivity(8), 4
    sigma = calibrate_sigma(eps, delta, sens, k)
    back = epsilon_for_sigma(sigma, delta, sens, k)
    assert back == pytest.approx(eps, rel=1e-9)
    assert back <= eps * (1 + 1e-12)  # the calibrated sigma never overspends
    assert epsilon_for_sigma(sigma * (1 - 1e-6), delta, sens, k) > eps  # and is the smallest one


def test_monotonicity():
    sens = wasp_sensitivity(8)
    sigmas_eps = [calibrate_sigma(e, 1e-5, sens, 4) for e in (0.05, 0.5, 1, 2, 8, 50)]
    assert all(a > b for a, b in zip(sigmas_eps, sigmas_eps[1:], strict=False))
    sigmas_delta = [calibrate_sigma(1.0, d, sens, 4) for d in (1e-12, 1e-8, 1e-5, 1e-2, 0.4)]
    assert all(a > b for a, b in zip(sigmas_delta, sigmas_delta[1:], strict=False))
    sigmas_k = [calibrate_sigma(1.0, 1e-5, sens, k) for k in (1, 2, 5, 20)]
    assert all(a < b for a, b in zip(sigmas_k, sigmas_k[1:], strict=False))
    assert calibrate_sigma(1.0, 1e-5, 2 * sens, 4) == pytest.approx(2 * calibrate_sigma(1.0, 1e-5, sens, 4))
    eps_sigma = [epsilon_for_sigma(s, 1e-5, sens, 4) for s in (0.5, 1, 3, 10, 100)]
    assert all(a > b for a, b in zip(eps_sigma, eps_sigma[1:], strict=False))


def test_epsilon_zero_for_overwhelming_noise():
    # delta(0) = 2 Phi(mu/2) - 1 < delta: no epsilon needed
    assert epsilon_for_mu(1e-6, 1e-5) == 0.0
    assert epsilon_for_mu(0.1, 1e-5) > 0.0


def test_paper_formula_and_inverse():
    assert paper_sigma(2.0, 1e-5, 3) == pytest.approx(4 * math.sqrt(2 * math.log(1.25e5)) * math.sqrt(2) / 2)
    for eps in (0.5, 1.0, 8.0):
        assert paper_epsilon(paper_sigma(eps, 1e-6, 7), 1e-6, 7) == pytest.approx(eps, rel=1e-13)
    with pytest.raises(ValueError):
        paper_sigma(1.0, 1e-5, 1)


@pytest.mark.parametrize(
    "args",
    [
        (0.0, 1e-5, 1.0, 1),
        (-1.0, 1e-5, 1.0, 1),
        (1.0, 0.0, 1.0, 1),
        (1.0, 1.0, 1.0, 1),
        (1.0, 1e-5, 0.0, 1),
        (1.0, 1e-5, 1.0, 0),
        (math.nan, 1e-5, 1.0, 1),
        (math.inf, 1e-5, 1.0, 1),
        (1.0, 1e-5, 1.0, 1.5),
    ],
)
def test_calibration_validation(args):
    with pytest.raises(ValueError):
        calibrate_sigma(*args)


@pytest.mark.parametrize(
    ("call", "named"),
    [
        (lambda: epsilon_for_sigma(0.0, 1e-5, 1.0, 1), "sigma must be"),
        (lambda: epsilon_for_sigma(1.0, 1e-5, -1.0, 1), "sensitivity must be"),
        (lambda: epsilon_for_sigma(1.0, 1e-5, 1.0, 0), "compositions must be"),
        (lambda: paper_epsilon(0.0, 1e-5, 5), "sigma must be"),
        (lambda: paper_epsilon(1.0, 1e-5, 1), "rounds must be"),
    ],
)
def test_a_bad_argument_is_named_in_the_error(call, named):
    """A user's typo in a config reaches these checks: the message must say which value is wrong."""
    with pytest.raises(ValueError, match=f"^{named}"):
        call()


def test_two_rounds_is_the_smallest_run_the_paper_formula_covers():
    """T=2 is one voting round: the paper's formula holds there and round-trips with paper_sigma."""
    sigma = paper_sigma(4.0, 1e-5, 2)
    assert paper_epsilon(sigma, 1e-5, 2) == pytest.approx(4.0)


# --- plan -------------------------------------------------------------------------------------------


def test_plan_exact_and_paper_report_both_epsilons():
    exact = plan_privacy(4.0, 1e-5, 5, 8)
    assert exact.compositions == 4 and exact.needs_noise
    assert exact.sensitivity == wasp_sensitivity(8)
    assert exact.epsilon_exact_spent == pytest.approx(4.0, rel=1e-9)
    assert exact.epsilon_paper_claimed == pytest.approx(paper_epsilon(exact.sigma, 1e-5, 5))
    assert exact.epsilon_paper_claimed > 4.0  # the paper's formula is looser
    paper = plan_privacy(4.0, 1e-5, 5, 8, mode="paper")
    assert paper.epsilon_paper_claimed == pytest.approx(4.0, rel=1e-12)
    assert paper.epsilon_exact_spent < 4.0
    assert json.loads(json.dumps(paper.to_dict()))["mode"] == "paper"


def test_plan_user_level_scales_noise():
    one = plan_privacy(2.0, 1e-5, 4, 8)
    three = plan_privacy(2.0, 1e-5, 4, 8, unit=PrivacyUnit(records_per_unit=3))
    assert three.sigma == pytest.approx(3 * one.sigma, rel=1e-12)
    paper3 = plan_privacy(2.0, 1e-5, 4, 8, mode="paper", unit=PrivacyUnit(records_per_unit=3))
    assert paper3.sigma == pytest.approx(3 * paper_sigma(2.0, 1e-5, 4))
    assert paper3.epsilon_paper_claimed == pytest.approx(2.0)


def test_plan_single_round_needs_no_noise():
    plan = plan_privacy(1.0, 1e-5, 1, 8)
    assert plan.compositions == 0 and plan.sigma is None and not plan.needs_noise
    assert plan.epsilon_exact_spent == 0.0 and plan.epsilon_paper_claimed == 0.0


@pytest.mark.parametrize("mode", ["exact", "paper"])
def test_a_plan_for_fewer_votes_spends_the_budget_on_less_noisy_ones(mode):
    every = plan_privacy(4.0, 1e-5, 5, 8, mode=mode)
    one = plan_privacy(4.0, 1e-5, 5, 8, mode=mode, votes=VoteShape(after=(2,)))
    assert every.compositions == 4 and one.compositions == 1 and one.rounds == 5
    assert every.vote_rounds == (0, 1, 2, 3) and one.vote_rounds == (2,)
    assert one.votes_after(2) and not one.votes_after(0) and not every.votes_after(4)
    assert one.sigma < every.sigma and one.epsilon_exact_spent <= 4.0 * (1 + 1e-9)
    if mode == "exact":  # k equal Gaussian votes compose as one of sigma / sqrt(k)
        assert one.sigma == pytest.approx(every.sigma / 2, rel=1e-6)
    assert plan_privacy(4.0, 1e-5, 5, 8, votes=VoteShape(after=())).sigma is None


@pytest.mark.parametrize(
    "kwargs",
    [dict(rounds=0), dict(mode="loose"), dict(q=0), dict(votes=VoteShape(after=(4,))),
     dict(votes=VoteShape(after=(-1,))), dict(votes=VoteShape(histograms=3))],
)  # fmt: skip
def test_plan_validation(kwargs):
    args = dict(epsilon=1.0, delta=1e-5, rounds=5, q=8) | kwargs
    with pytest.raises(ValueError):
        plan_privacy(**args)


@pytest.mark.parametrize("kwargs", [dict(neighbour="x"), dict(records_per_unit=0)])
def test_privacy_unit_validation(kwargs):
    with pytest.raises(ValueError):
        PrivacyUnit(**kwargs)


# --- ledger -----------------------------------------------------------------------------------------


def test_ledger_spends_the_planned_budget_and_refuses_more():
    plan = plan_privacy(3.0, 1e-5, 5, 8)
    ledger = PrivacyLedger(epsilon=3.0, delta=1e-5)
    for rnd in range(plan.compositions):
        ledger.record(GaussianRelease(rnd, plan.sigma, plan.sensitivity, "add_remove"))
    assert ledger.spent_epsilon() == pytest.approx(3.0, rel=1e-9)
    with pytest.raises(PrivacyBudgetExceeded):
        ledger.record(GaussianRelease(99, plan.sigma, plan.sensitivity, "add_remove"))
    assert len(ledger.releases) == plan.compositions  # refused before appending


def test_ledger_exact_composition_of_unequal_sigmas():
    ledger = PrivacyLedger(epsilon=50.0, delta=1e-6)
    ledger.record(GaussianRelease(0, 2.0, 1.5, "add_remove"))
    ledger.record(GaussianRelease(1, 4.0, 1.5, "add_remove"))
    mu = math.sqrt((1.5 / 2) ** 2 + (1.5 / 4) ** 2)
    assert ledger.spent_epsilon() == pytest.approx(epsilon_for_mu(mu, 1e-6), rel=1e-12)
    # the paper formula generalised: 4 sqrt(2 ln(1.25/delta)) sqrt(sum 1/sigma_i^2)
    expected = 4 * math.sqrt(2 * math.log(1.25e6)) * math.sqrt(1 / 4 + 1 / 16)
    assert ledger.spent_epsilon_paper() == pytest.approx(expected, rel=1e-12)


def test_ledger_paper_mode_holds_both_the_paper_claim_and_the_exact_guarantee():
    sigma = paper_sigma(2.0, 1e-5, 4)
    ledger = PrivacyLedger(epsilon=2.0, delta=1e-5, accountant="paper")
    for rnd in range(3):
        ledger.record(GaussianRelease(rnd, sigma, wasp_sensitivity(8), "add_remove"))
    assert ledger.spent_epsilon_paper() == pytest.approx(2.0, rel=1e-12)
    assert ledger.spent_epsilon() == ledger.spent_epsilon_exact() < 2.0  # the guarantee is the exact one
    with pytest.raises(PrivacyBudgetExceeded):  # the paper's own claim is over the budget
        ledger.record(GaussianRelease(3, sigma, wasp_sensitivity(8), "add_remove"))


@pytest.mark.parametrize(("epsilon", "neighbour"), [(80.0, "replace"), (200.0, "add_remove")])
def test_paper_formula_that_under_noises_is_refused(epsilon, neighbour):
    """The classic bound is proven for epsilon < 1 only; at large epsilon it under-noises (above
    about 70 under replace, 150 under add/remove), and the exact accountant, which checks every
    run, refuses it (in the plan and in the ledger)."""
    sigma = paper_sigma(epsilon, 1e-5, 5)
    sens = wasp_sensitivity(8, neighbour)
    assert epsilon_for_sigma(sigma, 1e-5, sens, 4) > epsilon  # it really under-noises
    with pytest.raises(PrivacyBudgetExceeded, match="under-noises"):
        plan_privacy(epsilon, 1e-5, 5, 8, mode="paper", unit=PrivacyUnit(neighbour))
    ledger = PrivacyLedger(epsilon=epsilon, delta=1e-5, accountant="paper")
    with pytest.raises(PrivacyBudgetExceeded, match="exact accountant"):
        for rnd in range(4):
            ledger.record(GaussianRelease(rnd, sigma, sens, neighbour))


def test_ledger_round_trip_and_report():
    ledger = PrivacyLedger(epsilon=8.0, delta=1e-5)
    sens = wasp_sensitivity(8, "replace")
    ledger.record(GaussianRelease(0, 3.0, sens, "replace"))
    ledger.record(GaussianRelease(1, 3.0, sens, "replace"))
    data = json.loads(json.dumps(ledger.to_dict()))
    again = PrivacyLedger.from_dict(data)
    assert again.to_dict() == ledger.to_dict()
    assert again.spent_epsilon() == ledger.spent_epsilon()
    report = LedgerReport.of(ledger)
    json.dumps(dataclasses.asdict(report))
    assert report.compositions == 2 and report.sigma == 3.0 and report.neighbour == "replace"
    assert report.sensitivity == sens and report.epsilon_budget == 8.0 and report.delta == 1e-5
    assert report.epsilon_spent_exact == pytest.approx(epsilon_for_sigma(3.0, 1e-5, sens, 2))
    assert report.epsilon_spent_paper > report.epsilon_spent_exact
    assert PrivacyLedger(epsilon=1.0, delta=1e-5).spent_epsilon() == 0.0


@pytest.mark.parametrize(
    "args",
    [
        (-1, 1.0, 1.0, "add_remove"),
        (0, 0.0, 1.0, "add_remove"),
        (0, 1.0, -1.0, "add_remove"),
        (0, 1.0, 1.0, "other"),
    ],
)
def test_release_validation(args):
    with pytest.raises(ValueError):
        GaussianRelease(*args)


def test_ledger_validation():
    with pytest.raises(ValueError):
        PrivacyLedger(epsilon=0.0, delta=1e-5)
    with pytest.raises(ValueError):
        PrivacyLedger(epsilon=1.0, delta=1e-5, accountant="nope")


def test_accountants_are_composers_with_one_interface():
    """Both accountants compose the same release values and calibrate sigma for the other's epsilon."""
    releases = [GaussianRelease(t, 3.0, wasp_sensitivity(8), "add_remove") for t in range(4)]
    exact, paper = ExactAccountant(), PaperAccountant()
    assert exact.epsilon(releases, 1e-5) < paper.epsilon(releases, 1e-5)
    sigma = exact.sigma(exact.epsilon(releases, 1e-5), 1e-5, wasp_sensitivity(8), 4, 1)
    assert sigma == pytest.approx(3.0, rel=1e-9)
    sigma = paper.sigma(paper.epsilon(releases, 1e-5), 1e-5, wasp_sensitivity(8), 4, 1)
    assert sigma == pytest.approx(3.0, rel=1e-12)
    assert exact.epsilon([], 1e-5) == paper.epsilon([], 1e-5) == 0.0
