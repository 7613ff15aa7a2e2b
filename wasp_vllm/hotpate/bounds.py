"""The bounds behind Hot PATE's target charging: pure functions of public parameters.

The Laplace test's stability (:func:`stability_delta`, :func:`stability_margin`), the boundary
wrapper's epsilon and q-target probability (:func:`wrapper_epsilon`, :func:`boundary_q`,
:func:`not_prior_q`), and the composition of the charged draws (:func:`tct_epsilon`,
:func:`plain_composition_epsilon`).  :mod:`wasp_vllm.hotpate.accounting` states the analysis and
holds the mechanism and the accountant that use them.
"""

from __future__ import annotations

import math

from scipy.special import bdtr

#: Shares of the delta left after the stability failures given to the NegBin tail; the best is used.
_TAIL_SHARES = (0.05, 0.1, 0.2, 0.3, 0.5, 0.7)
THEOREM = (
    "Target charging (Cohen & Lyu 2023, Sec. 2: q-targets, TCT): (eps, delta_c + delta_t + calls * "
    "delta_s)-DP, eps = min(m eps_B, eps_B sqrt(2 m ln(1/delta_c)) + m eps_B^2 / 2) over m private "
    "eps_B-DP draws, m = smallest with Pr[NegBin(cap, q) > m] <= delta_t"
)


def check_unit(name: str, value: float) -> None:
    if not 0.0 < value <= 1.0:
        raise ValueError(f"{name} must be in (0, 1], got {value!r}")


def laplace_sf(x: float, scale: float) -> float:
    """``S(x) = Pr[Laplace(0, scale) >= x]``: ``e^(-x/b)/2`` for ``x >= 0``, ``1 - e^(x/b)/2`` below."""
    if scale <= 0:
        raise ValueError("scale must be > 0")
    if x >= 0:
        return 0.5 * math.exp(-x / scale)
    return 1.0 - 0.5 * math.exp(x / scale)


def wrapper_epsilon(eps_test: float, gamma: float) -> float:
    """Exact DP level of the wrapped test: ``max(eps, ln((2 - e^-eps)(2 - gamma e^-eps) / (2 - gamma)))``.

    The law is ``((1 - gamma u)(1 - pi), (1 - gamma u) pi, gamma u)`` on (⊥, token, ⊤), symmetric
    under ``pi <-> 1 - pi``.  ``⊤`` moves by ``<= e^eps``; the token ratio is ``<= e^eps`` when both
    ``pi <= 1/2`` or when ``pi0 = e^eps pi1``; it is ``<= 1`` when ``pi0 <= 1/2 <= pi1``; when both
    ``pi >= 1/2`` it grows with ``u1`` and is largest at ``u1 = 1/2``, ``u0 = e^-eps / 2``; on the
    remaining edge ``1 - pi1 = e^eps (1 - pi0)`` its log is convex, so an end point is the maximum.
    """
    check_unit("gamma", gamma)
    tail = math.exp(-eps_test)
    return max(eps_test, math.log((2.0 - tail) * (2.0 - gamma * tail) / (2.0 - gamma)))


def boundary_q(eps_test: float, gamma: float, eps_private: float) -> float:
    """Target probability of ``⊤`` for the boundary wrapper with ``eps_B = eps_private``.

    Proof.  Put all of ``⊤`` in the private part and, on each other outcome with masses
    ``x0 >= x1``, the least residuals ``r1 = (x0 - x1)/(E - 1)``, ``r0 = r1 + x0 - x1`` that keep
    ``B^0, B^1`` ``eps_B``-close (valid iff ``x0 <= E x1``, i.e. ``eps_B >= eps_W``).  With
    ``S = sum |x0 - x1|`` over {token, ⊥}, the private mass is
    ``gamma (u0 + u1)/2 + S (E + 1)/(2 (E - 1))``.  For an ``eps``-DP test
    ``|pi0 - pi1| <= (e^eps - 1) u_min`` and ``|u0 - u1| <= (e^eps - 1) u_min``, so
    ``S <= (2 + gamma)(e^eps - 1) u_min``; with ``u0 + u1 <= (1 + e^eps) u_min`` the ratio
    ``q = gamma u_min / mass`` is at least the value returned.
    """
    if eps_private < wrapper_epsilon(eps_test, gamma) - 1e-12:
        raise ValueError("eps_private must be >= wrapper_epsilon(eps_test, gamma)")
    e, big = math.exp(eps_test), math.exp(eps_private)
    return 2.0 * gamma / (gamma * (1.0 + e) + (2.0 + gamma) * (e - 1.0) * (big + 1.0) / (big - 1.0))


def not_prior_q(eps: float) -> float:
    """NotPrior target (every outcome but ``⊥``) of an eps-DP mechanism: ``q = 1 / (e^eps + 1)``."""
    return 1.0 / (math.exp(eps) + 1.0)


def stability_delta(margin: float, scale: float, gamma: float = 0.0, votes_changed: int = 1) -> float:
    """Per-call ``delta_s = (1 + gamma) S(margin - Delta)``: the chance of any non-``⊥`` output
    when neighbours disagree on the top token (then ``c_max <= n/2 + Delta``; ``⊤`` has
    probability ``gamma u <= gamma pi``)."""
    return (1.0 + gamma) * laplace_sf(margin - votes_changed, scale)


def stability_margin(scale: float, delta_s: float, gamma: float = 0.0, votes_changed: int = 1) -> float:
    """Smallest ``margin`` with :func:`stability_delta` ``<= delta_s``."""
    if not 0.0 < delta_s < 0.5:
        raise ValueError("delta_s must be in (0, 0.5)")
    return votes_changed + scale * math.log((1.0 + gamma) / (2.0 * delta_s))


def composition_epsilon(k: int, eps: float, delta: float) -> float:
    """Epsilon of ``k`` adaptive ``eps``-DP mechanisms at ``delta``: the smaller of ``k eps`` and
    ``eps sqrt(2 k ln(1/delta)) + k eps^2 / 2`` (Azuma over privacy losses in ``[-eps, eps]`` as in
    Dwork & Roth 2014, Thm 3.20, with the mean loss ``<= eps^2 / 2`` of Bun & Steinke 2016, Prop 3.3)."""
    if k <= 0:
        return 0.0
    if not 0.0 < delta < 1.0:
        return k * eps
    return min(k * eps, eps * math.sqrt(2.0 * k * math.log(1.0 / delta)) + k * eps * eps / 2.0)


def private_draws_bound(hits: int, q: float, delta_tail: float) -> int:
    """Smallest ``m`` with ``Pr[Bin(m, q) < hits] <= delta_tail``, i.e. ``Pr[NegBin(hits, q) > m]``."""
    if hits <= 0:
        return 0
    if not (0.0 < q <= 1.0 and 0.0 < delta_tail < 1.0):
        raise ValueError("need 0 < q <= 1 and 0 < delta_tail < 1")
    if q == 1.0:
        return hits
    hi = max(hits, int(math.ceil(2.0 * hits / q)))
    while bdtr(hits - 1, hi, q) > delta_tail:
        hi *= 2
    lo = hits - 1  # invariant: bdtr(hits-1, lo) > delta_tail (Bin(hits-1, q) < hits surely)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if bdtr(hits - 1, mid, q) <= delta_tail else (mid, hi)
    return hi


def _tct_split(hits: int, q: float, eps_b: float, delta: float, share: float) -> float:
    """Epsilon with ``share`` of ``delta`` for the NegBin tail and the rest for composition."""
    m = private_draws_bound(hits, q, share * delta)
    return composition_epsilon(m, eps_b, (1.0 - share) * delta)


def tct_epsilon(hits: int, targets: list[tuple[float, float]], delta: float, delta_bad: float = 0.0) -> float:
    """Epsilon of a run that halts at its ``hits``-th target hit, overall ``delta``.

    ``targets``: valid ``(q, eps_B)`` pairs of the step; ``delta_bad``: total probability of the
    per-call stability failures (``max_calls * delta_s``).  Guarantee: ``(eps, delta)``-DP with
    ``eps = min`` over pairs and splits of ``composition_epsilon(m, eps_B, delta_c)``, where
    ``m = private_draws_bound(hits, q, delta_t)`` and ``delta_c + delta_t + delta_bad = delta``.

    Proof (privacy loss, as in Dwork & Roth Thm 3.20).  Simulate each call of a neighbouring pair
    as: with probability ``p`` a draw from ``C`` (same law for both data sets), else a draw from
    ``B^b``; an unstable call (neighbours disagree on the top token) is a common law except with
    probability ``<= delta_s``.  On the event ``G`` = "no unstable exception and at most ``m``
    ``B`` draws" the likelihood ratio of a path is the product of its ``B`` ratios, so
    ``P0(S) <= e^eps P1(S) + P0[L_m > eps] + P0[not G]``; Azuma over the ``<= m`` terms (each in
    ``[-eps_B, eps_B]``, mean ``<= eps_B^2 / 2``) gives ``P0[L_m > eps] <= delta_c``; each ``B``
    draw hits w.p. ``>= q``, so ``P[more than m B draws] <= Pr[Bin(m, q) < hits] <= delta_t``.
    """
    if hits < 0 or not 0.0 < delta < 1.0 or not 0.0 <= delta_bad < delta:
        raise ValueError("need hits >= 0, 0 < delta < 1 and 0 <= delta_bad < delta")
    if hits == 0:
        return 0.0
    rest = delta - delta_bad
    return min(_tct_split(hits, q, e, rest, s) for q, e in targets for s in _TAIL_SHARES)


def plain_composition_epsilon(calls: int, eps_call: float, delta: float, delta_s: float = 0.0) -> float:
    """What composing every call would cost: ``calls`` adaptive ``(eps_call, delta_s)``-DP steps
    (:func:`composition_epsilon`), overall ``delta`` (``inf`` if the calls' deltas exceed it)."""
    rest = delta - calls * delta_s
    return composition_epsilon(calls, eps_call, rest) if rest > 0 else math.inf
