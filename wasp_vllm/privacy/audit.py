"""Empirical privacy audit: a statistical lower bound on the epsilon a mechanism really has.

Run a mechanism many times on two neighbouring inputs ``D`` (with a canary) and ``D'`` (without)
and score every output with a distinguishing statistic (higher = "looks like D").  An
(epsilon, delta)-DP mechanism bounds every test ``score > t`` by

    TPR <= e^epsilon * FPR + delta

so with a one-sided Clopper-Pearson lower bound on TPR and upper bound on FPR (each at level
``alpha / 2``), ``epsilon >= log((TPR_lo - delta) / FPR_hi)`` holds with confidence ``1 - alpha``.
The threshold ``t`` is chosen on a calibration half of the trials and the bound computed on the
other half, so choosing it does not bias the bound.  A claimed epsilon below the bound is
refuted; one above it is consistent with the observations (an audit can catch under-noising,
never prove a guarantee).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy.stats import beta


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
