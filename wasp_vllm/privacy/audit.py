"""Empirical privacy audits: statistical lower bounds on the privacy a mechanism really spends.

Two audits of neighbouring runs, each with its own use:

* :func:`gdp_audit` (the audits of the Gaussian releases): every release of this project is a
  Gaussian mechanism, and a composition of Gaussian mechanisms is exactly ``mu``-GDP: every test
  of ``D`` against ``D'`` has ``TPR <= Phi(Phi^-1(FPR) + mu)`` at *every* false-positive rate.
  Checking the whole trade-off curve (several FPRs, not one threshold) with many cheap trials
  gives the audit enough power to tell ``sigma`` from ``sigma / sqrt 2``.
* :func:`epsilon_lower_bound` (mechanisms that are not Gaussian, e.g. target charging): run a
  mechanism many times on two neighbouring inputs ``D`` (with a canary) and ``D'`` (without) and
  score every output with a distinguishing statistic (higher = "looks like D").  An
  (epsilon, delta)-DP mechanism bounds every test ``score > t`` by ``TPR <= e^epsilon FPR + delta``,

  so with a one-sided Clopper-Pearson lower bound on TPR and upper bound on FPR (each at level
  ``alpha / 2``), ``epsilon >= log((TPR_lo - delta) / FPR_hi)`` holds with confidence ``1 - alpha``.

Thresholds are chosen on a calibration half of the trials and the bounds computed on the other
half, so choosing them does not bias the bounds.  A claim below the bound is refuted; one above it
is consistent with the observations (an audit can catch under-noising, never prove a guarantee).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy.stats import beta, binom, norm


def clopper_pearson(successes: int, trials: int, alpha: float) -> tuple[float, float]:
    """Exact two-sided ``1 - alpha`` interval for a binomial proportion."""
    if trials <= 0 or not 0 <= successes <= trials:
        raise ValueError("need 0 <= successes <= trials and trials > 0")
    lo = 0.0 if successes == 0 else float(beta.ppf(alpha / 2, successes, trials - successes + 1))
    hi = 1.0 if successes == trials else float(beta.ppf(1 - alpha / 2, successes + 1, trials - successes))
    return lo, hi


def _bound(tpr_k: int, fpr_k: int, n_pos: int, n_neg: int, delta: float, alpha: float) -> float:
    tpr_lo, _ = clopper_pearson(tpr_k, n_pos, alpha)
    _, fpr_hi = clopper_pearson(fpr_k, n_neg, alpha)
    if tpr_lo <= delta:
        return 0.0
    return max(0.0, math.log((tpr_lo - delta) / fpr_hi))


@dataclass(frozen=True)
class AuditResult:
    """The lower bound on epsilon and the test that achieved it."""

    epsilon_lower_bound: float
    threshold: float
    tpr: float
    fpr: float
    trials_per_side: int
    confidence: float


def epsilon_lower_bound(
    scores_with: np.ndarray, scores_without: np.ndarray, delta: float, alpha: float = 0.05
) -> AuditResult:
    """Lower bound on epsilon from scores of outputs on ``D`` (``scores_with``) and ``D'``."""
    pos, neg = np.asarray(scores_with, dtype=float), np.asarray(scores_without, dtype=float)
    half_p, half_n = len(pos) // 2, len(neg) // 2
    if min(half_p, half_n) < 10:
        raise ValueError("an audit needs at least 20 trials per side")
    cal_p, cal_n = np.sort(pos[:half_p]), np.sort(neg[:half_n])

    def calibrated(t: float) -> float:
        tp = half_p - int(np.searchsorted(cal_p, t, side="right"))
        fp = half_n - int(np.searchsorted(cal_n, t, side="right"))
        return _bound(tp, fp, half_p, half_n, delta, alpha)

    candidates = np.quantile(cal_n, np.linspace(0.5, 1.0, 201))
    threshold = float(max(candidates, key=calibrated))
    ev_p, ev_n = pos[half_p:], neg[half_n:]
    tp, fp = int((ev_p > threshold).sum()), int((ev_n > threshold).sum())
    return AuditResult(
        epsilon_lower_bound=_bound(tp, fp, len(ev_p), len(ev_n), delta, alpha),
        threshold=threshold,
        tpr=tp / len(ev_p),
        fpr=fp / len(ev_n),
        trials_per_side=len(pos),
        confidence=1 - alpha,
    )


@dataclass(frozen=True)
class TradeoffPoint:
    """One test of the trade-off audit: its threshold, FPR upper and TPR lower confidence bounds, and
    the most TPR a ``mu_claimed``-GDP mechanism allows at that FPR."""

    fpr_target: float
    threshold: float
    fpr_upper: float
    tpr_lower: float
    tpr_allowed: float


@dataclass(frozen=True)
class TradeoffAudit:
    """A lower bound on the ``mu`` of a Gaussian-DP mechanism, against the ``mu`` it claims."""

    mu_claimed: float
    mu_lower_bound: float
    points: tuple[TradeoffPoint, ...]
    trials_per_side: int
    confidence: float

    @property
    def refuted(self) -> bool:
        """True when the observations contradict the claim (at the audit's confidence)."""
        return self.mu_lower_bound > self.mu_claimed


#: FPRs at which the trade-off curve is tested: the tail (where an under-noised release shows
#: first at small mu) and the middle (where it shows at large mu).
AUDIT_FPRS = (0.001, 0.01, 0.05, 0.1, 0.25, 0.5)


def gdp_audit(
    scores_with: np.ndarray,
    scores_without: np.ndarray,
    mu_claimed: float,
    fprs: tuple[float, ...] = AUDIT_FPRS,
    alpha: float = 1e-3,
) -> TradeoffAudit:
    """Audit a claim of ``mu``-GDP from test scores on ``D`` (``scores_with``) and ``D'``.

    Thresholds are the ``1 - fpr`` quantiles of a calibration half of the ``D'`` scores; the other
    halves give one-sided Clopper-Pearson bounds (Bonferroni over the ``2 len(fprs)`` bounds, so
    all hold together with confidence ``1 - alpha``).  Each point gives
    ``mu >= Phi^-1(TPR_lower) - Phi^-1(FPR_upper)``; the bound is the largest.
    """
    pos, neg = np.asarray(scores_with, dtype=float), np.asarray(scores_without, dtype=float)
    half_p, half_n = len(pos) // 2, len(neg) // 2
    if min(half_p, half_n) < 100:
        raise ValueError("a trade-off audit needs at least 200 trials per side")
    calibration, ev_p, ev_n = neg[:half_n], pos[half_p:], neg[half_n:]
    two_sided = 2 * alpha / (2 * len(fprs))  # clopper_pearson spends alpha/2 on each side
    points, bound = [], 0.0
    for fpr in fprs:
        threshold = float(np.quantile(calibration, 1.0 - fpr))
        tpr_lo, _ = clopper_pearson(int((ev_p > threshold).sum()), len(ev_p), two_sided)
        _, fpr_hi = clopper_pearson(int((ev_n > threshold).sum()), len(ev_n), two_sided)
        allowed = float(norm.cdf(norm.ppf(fpr_hi) + mu_claimed))
        points.append(TradeoffPoint(fpr, threshold, fpr_hi, tpr_lo, allowed))
        if tpr_lo > 0.0 and fpr_hi < 1.0:
            bound = max(bound, float(norm.ppf(tpr_lo) - norm.ppf(fpr_hi)))
    return TradeoffAudit(mu_claimed, bound, tuple(points), min(len(pos), len(neg)), 1.0 - alpha)


# --------------------------------------------------------------------------------------------
# one-run auditing (Steinke, Nasr & Jagielski 2023)
# --------------------------------------------------------------------------------------------


def one_run_p_value(m: int, r: int, v: int, epsilon: float, delta: float) -> float:
    """Chance of ``v`` or more correct guesses out of ``r`` if the run is ``(epsilon, delta)``-DP.

    ``m`` canaries are each put in the data by an independent fair coin; an attacker that sees only
    the output guesses in/out for ``r`` of them.  Under ``epsilon``-DP each guess is right with
    probability at most ``q = e^eps / (1 + e^eps)``, so the count of right guesses is dominated by
    ``Binomial(r, q)``; ``delta`` adds at most ``2 m delta`` times the largest average of that
    binomial's ``i`` point masses just below ``v`` (Steinke, Nasr & Jagielski 2023, Theorem 3.3).
    """
    if not 0 <= v <= r <= m or epsilon < 0 or not 0 <= delta <= 1:
        raise ValueError("need 0 <= v <= r <= m, epsilon >= 0 and 0 <= delta <= 1")
    q = 1.0 / (1.0 + math.exp(-epsilon))
    tail = float(binom.sf(v - 1, r, q))
    if v == 0 or delta == 0:
        return min(1.0, tail)
    below = binom.cdf(v - 1, r, q) - binom.cdf(v - 1 - np.arange(1, v + 1), r, q)
    return min(1.0, tail + 2 * m * delta * float(np.max(below / np.arange(1, v + 1))))


def one_run_epsilon_lower_bound(m: int, r: int, v: int, delta: float, confidence: float = 0.95) -> float:
    """The largest epsilon that ``v`` right guesses of ``r`` refute at ``confidence`` (0 if none)."""
    if not 0 < confidence < 1:
        raise ValueError("confidence must be in (0, 1)")
    alpha = 1.0 - confidence
    if one_run_p_value(m, r, v, 0.0, delta) >= alpha:
        return 0.0
    lo, hi = 0.0, 1.0
    while one_run_p_value(m, r, v, hi, delta) < alpha:
        lo, hi = hi, 2 * hi
    for _ in range(50):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if one_run_p_value(m, r, v, mid, delta) < alpha else (lo, mid)
    return lo


# What an audit of this design can show at best, before it runs.  A one-run audit puts each canary
# in by a fair coin and its attack guesses "in" for the canaries it sees echoed (plus, optionally,
# ``out_guesses`` "out" guesses); a perfect attack is right every time, so the most it can prove
# is the bound of all guesses right.  A design whose best falls short of the claim cannot refute it,
# whatever the run leaks: its "no leak found" would mean nothing.

#: More canaries than this is not a plan: the run would be mostly canaries (and the delta term,
#: which grows with the count, has long overtaken the gain; epsilon 8 at delta 1e-5 is out of reach).
MOST_CANARIES = 100_000


def best_possible_bound(
    canaries: int, delta: float, confidence: float = 0.95, out_guesses: int = 0, short_sd: float = 0.0
) -> float:
    """The lower bound a perfect attack proves when the coins put in half the canaries, as expected,
    less ``short_sd`` standard deviations of their count: every one of them guessed "in" and
    ``out_guesses`` others guessed "out", all right."""
    fewer = short_sd * math.sqrt(canaries) / 2
    guesses = min(canaries, max(0, int(canaries / 2 - fewer)) + out_guesses)
    return one_run_epsilon_lower_bound(canaries, guesses, guesses, delta, confidence)


#: Standard deviations of the coins' count below its mean that the default canary count allows for:
#: with 2, a perfect leak refutes the claim for 98 % of the coins' draws (with 1, 87 %: 353
#: canaries at epsilon 4, and a run of the planted leak saw 159 of 159 right prove only 3.95).
COIN_MARGIN_SD = 2.0


def canaries_to_refute(
    epsilon: float, delta: float, confidence: float = 0.95, out_guesses: int = 0
) -> int | None:
    """The fewest canaries whose best bound, with the coins' margin, exceeds ``epsilon`` (373 at
    epsilon 4, delta 1e-5, 95 %); None when no count up to :data:`MOST_CANARIES` does."""

    def refutes(m: int) -> bool:
        return best_possible_bound(m, delta, confidence, out_guesses, COIN_MARGIN_SD) > epsilon

    low, high, last = 2, 4, 0.0
    while not refutes(high):  # doubling while the bound grows; the delta term ends the growth
        bound = best_possible_bound(high, delta, confidence, out_guesses, COIN_MARGIN_SD)
        if 0 < bound < last or high >= MOST_CANARIES:
            return None
        low, high, last = high, min(2 * high, MOST_CANARIES), bound
    while high - low > 1:  # the bound rises in the count on this stretch: bisect it
        mid = (low + high) // 2
        low, high = (low, mid) if refutes(mid) else (mid, high)
    return high


def realised_ceiling(
    canaries: int, included: int, delta: float, confidence: float = 0.95, out_guesses: int = 0
) -> float:
    """The most one run proves with the coins it drew (``included`` canaries in): a perfect attack
    guesses every one of them "in" and ``out_guesses`` others "out", all right.  Before the run,
    :func:`best_possible_bound` expects half in; after it, the operator (who holds the coins) knows."""
    guesses = included + min(out_guesses, canaries - included)
    return one_run_epsilon_lower_bound(canaries, guesses, guesses, delta, confidence)


def fewest_echoes_to_refute(
    canaries: int, included: int, epsilon: float, delta: float, confidence: float = 0.95
) -> int | None:
    """The fewest included canaries that must echo, with no left-out canary echoing (every guess
    right), for the bound to exceed ``epsilon``; None when even all ``included`` cannot.  Each
    chance echo of a left-out canary is a wrong guess and raises the count."""

    def refutes(right: int) -> bool:
        return one_run_epsilon_lower_bound(canaries, right, right, delta, confidence) > epsilon

    if not refutes(included):
        return None
    low, high = 0, included  # refutes(high); the bound grows with the right guesses: bisect
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (low, mid) if refutes(mid) else (mid, high)
    return high if not refutes(low) else low
