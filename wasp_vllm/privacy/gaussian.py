"""The analytic Gaussian mechanism (Balle & Wang 2018) and Gaussian-DP composition (Dong, Roth &
Su 2019): the numerics every accountant here stands on.

Gaussian releases of L2 sensitivity ``Delta_i`` and noise ``sigma_i`` compose exactly into one
Gaussian mechanism with ``mu = sqrt(sum_i (Delta_i / sigma_i)^2)``, whose tight (epsilon, delta)
curve is::

    delta(eps) = Phi(mu/2 - eps/mu) - e^eps * Phi(-mu/2 - eps/mu)

All numerics work on ``log(delta)`` with ``scipy.special.log_ndtr`` / ``erfcx`` so that epsilon from
0.01 to 100 and delta from 1e-12 to 0.5 neither overflow nor cancel.  Calibration is done by
bisection in log space and always returns the *conservative* end of the final bracket (a sigma
that is never too small, an epsilon that is never too small).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
from scipy.special import erfcx, log_ndtr

_SQRT2 = math.sqrt(2.0)


def check_positive(name: str, value: float) -> float:
    """Reject non-numbers, NaN, inf and non-positive values with a message naming the argument."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ValueError(f"{name} must be a real number, got {type(value).__name__}")
    value = float(value)
    if not math.isfinite(value) or value <= 0.0:
        raise ValueError(f"{name} must be finite and > 0, got {value!r}")
    return value


def check_delta(delta: float) -> float:
    delta = check_positive("delta", delta)
    if delta >= 1.0:
        raise ValueError(f"delta must be in (0, 1), got {delta!r}")
    return delta


def check_int(name: str, value: int, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"{name} must be an integer, got {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return int(value)


def log_delta_gaussian(epsilon: float, mu: float) -> float:
    """``log delta(epsilon)`` of a Gaussian mechanism with ``mu = sensitivity / sigma``.

    With ``a = mu/2 - eps/mu`` and ``b = -mu/2 - eps/mu`` one has ``b^2 - a^2 = 2 eps`` exactly, so
    ``e^eps Phi(b) / Phi(a) = erfcx(-b/sqrt2) / erfcx(-a/sqrt2)`` when ``a < 0``: no exponential of
    epsilon is ever formed and both tails stay accurate far out.  For ``a >= 0`` ``Phi(a) >= 1/2``
    and the plain log-space ratio is well conditioned.  Returns ``-inf`` when delta underflows.
    """
    if epsilon < 0.0 or mu <= 0.0:
        raise ValueError("log_delta_gaussian needs epsilon >= 0 and mu > 0")
    a = mu / 2.0 - epsilon / mu
    b = -mu / 2.0 - epsilon / mu
    if a < 0.0:
        ratio = float(erfcx(-b / _SQRT2) / erfcx(-a / _SQRT2))
    else:
        ratio = math.exp(epsilon + float(log_ndtr(b)) - float(log_ndtr(a)))
    if ratio >= 1.0:
        return -math.inf
    return float(log_ndtr(a)) + math.log1p(-ratio)


def delta_for_epsilon_mu(epsilon: float, mu: float) -> float:
    """``delta(epsilon)`` of a Gaussian mechanism with ``mu = sensitivity / sigma`` (Balle & Wang)."""
    return math.exp(log_delta_gaussian(epsilon, mu))


def _bisect_log(
    pred: Callable[[float], bool], lo: float, hi: float, rtol: float = 1e-15
) -> tuple[float, float]:
    """Bisect in log space on a monotone predicate with ``pred(lo)`` true and ``pred(hi)`` false.

    Returns the final bracket ``(lo, hi)``; the caller picks the conservative end.  Geometric
    midpoints make the relative precision uniform whatever the scale of the answer.
    """
    for _ in range(400):
        if hi <= lo * (1.0 + rtol):
            break
        mid = math.sqrt(lo * hi)
        if mid <= lo or mid >= hi:
            break
        if pred(mid):
            lo = mid
        else:
            hi = mid
    return lo, hi


def _expand(pred: Callable[[float], bool], start: float, grow: bool, limit: int = 200) -> float:
    """Multiply (or divide) ``start`` by 2 until ``pred`` flips, to find a bisection bracket end."""
    x = start
    for _ in range(limit):
        if pred(x) != grow:
            return x
        x = x * 2.0 if grow else x / 2.0
    raise ArithmeticError("could not bracket the privacy parameter (arguments far out of range)")


def mu_for_epsilon(epsilon: float, delta: float) -> float:
    """Largest ``mu`` such that a ``mu``-Gaussian mechanism is (epsilon, delta)-DP.

    ``delta(eps; mu)`` increases with ``mu``, so bisection on ``log mu`` is safe; the lower end of
    the final bracket is returned so that the guarantee always holds.
    """
    epsilon = check_positive("epsilon", epsilon)
    delta = check_delta(delta)
    target = math.log(delta)

    def ok(mu: float) -> bool:
        return log_delta_gaussian(epsilon, mu) <= target

    hi = _expand(ok, 1.0, grow=True)
    lo = _expand(ok, hi / 2.0, grow=False)
    lo, _ = _bisect_log(ok, lo, hi)
    return lo


def epsilon_for_mu(mu: float, delta: float) -> float:
    """Smallest ``epsilon`` with which a ``mu``-Gaussian mechanism is (epsilon, delta)-DP.

    Returns 0.0 when even epsilon = 0 meets delta (tiny mu).  ``delta(eps)`` decreases with
    epsilon; the upper end of the final bracket is returned (never under-reports).
    """
    mu = check_positive("mu", mu)
    delta = check_delta(delta)
    target = math.log(delta)

    def too_small(eps: float) -> bool:
        return log_delta_gaussian(eps, mu) > target

    if not too_small(0.0):
        return 0.0
    hi = _expand(too_small, 1.0, grow=True)
    lo = hi / 2.0
    while not too_small(lo) and lo > 1e-300:
        lo /= 2.0
    if lo <= 1e-300:
        return hi
    _, hi = _bisect_log(too_small, lo, hi)
    return hi


def calibrate_sigma(epsilon: float, delta: float, sensitivity: float, compositions: int) -> float:
    """Smallest sigma making ``compositions`` Gaussian releases of L2 ``sensitivity`` (eps, delta)-DP.

    The releases compose into one Gaussian with ``D = sensitivity * sqrt(compositions)``; sigma is
    ``D / mu*`` with ``mu*`` from :func:`mu_for_epsilon` (analytic Gaussian mechanism).
    """
    sensitivity = check_positive("sensitivity", sensitivity)
    compositions = check_int("compositions", compositions, 1)
    mu = mu_for_epsilon(epsilon, delta)
    # Divide by the (conservatively small) mu; nudge up by one ulp so rounding never undershoots.
    return math.nextafter(sensitivity * math.sqrt(compositions) / mu, math.inf)


def epsilon_for_sigma(sigma: float, delta: float, sensitivity: float, compositions: int) -> float:
    """Epsilon spent by ``compositions`` Gaussian releases with noise ``sigma`` (inverse of calibrate)."""
    sigma = check_positive("sigma", sigma)
    sensitivity = check_positive("sensitivity", sensitivity)
    compositions = check_int("compositions", compositions, 1)
    return epsilon_for_mu(sensitivity * math.sqrt(compositions) / sigma, delta)
