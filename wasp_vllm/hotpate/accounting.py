"""Data-dependent privacy accounting for Hot PATE: target charging with a boundary wrapper.

One aggregation step (homogeneous ensembles, Hot PATE Algorithm 2 "DistAgg homogeneous") is a
*private test* followed by a stable release:

* test: ``c_max + Z >= T`` with ``Z ~ Laplace(b)``, ``c_max`` the top vote count, ``T = n/2 + margin``;
* release: the top token ``j* = argmax_j c_j`` (ties to the lowest id) when the test passes, else ``⊥``.

One record changes ``Delta`` votes (1 under add/remove, 2 under replace), so ``c_max`` moves by at
most ``Delta`` and the test is ``eps_test = Delta / b``-DP (Laplace mechanism).  The released
*identity* needs no noise: two neighbours can have different top tokens only if both have
``c_max <= n/2 + Delta`` (one token then leads by at most ``2 Delta``), and there the test passes
with probability at most ``S(margin - Delta)``, ``S`` the Laplace survival function.  That is a
per-call ``delta_s`` (:func:`stability_delta`), paid on *every* call, so ``margin`` must be large
(:func:`stability_margin`).  Tokens nobody voted for can never be output: no vocabulary-wide noise.

**Target charging** (Cohen & Lyu 2023, "The Target-Charging Technique for Privacy Analysis across
Interactive Computations", NeurIPS; Section 2, q-targets and the TCT algorithm).  An output set
``⊤`` is a *q-target* of a mechanism if for every neighbouring pair the two output laws split as
``p C + (1-p) B^b`` (``b = 0, 1``) with ``B^0, B^1`` ``eps_B``-indistinguishable and
``B^b(⊤) >= q``.  A run that halts after its ``tau``-th target hit then costs what ``m`` adaptive
``eps_B``-DP mechanisms cost (:func:`composition_epsilon` at ``delta_c``), where
``Pr[NegBin(tau, q) > m] <= delta_t``, plus ``delta_t`` and ``calls * delta_s`` in delta: the ``C``
draws are data-free and each ``B`` draw hits the target with probability ``>= q``
(:func:`tct_epsilon`).  The hit cap is fixed in advance from the budget; the run stops *before*
a call that could be the hit past it (:class:`TargetChargingAccountant`).

Two targets are offered (:class:`BoundaryNoisyArgMax`, ``wrapper=``):

* ``not_prior``: ``⊤`` = every yielded token, ``⊥`` is the "prior"; ``q = 1/(e^eps + 1)``,
  ``eps_B = eps_test`` (TCT's NotPrior target).  Calls returning ``⊥`` are free.
* ``boundary`` (default; after TCT's boundary wrapper for private tests, in a form and with
  constants derived here, as the paper's statement could not be consulted): with
  ``pi = S(T - c_max)`` the pass probability and ``u = min(pi, 1 - pi)``, output the extra symbol
  ``⊤`` ("boundary", charged, no token) with probability ``gamma * u``, else run the test.  Calls
  whose test is near-certain either way (``⊥`` *or* a dominant token) have ``u ~ 0`` and are
  almost never charged.  The wrapped step is
  ``eps_W = max(eps, ln((2 - e^-eps)(2 - gamma e^-eps) / (2 - gamma)))``-DP (exact,
  :func:`wrapper_epsilon`) and ``⊤`` is a q-target for every ``eps_B >= eps_W`` with
  ``q = 2 gamma / (gamma (1 + e^eps) + (2 + gamma)(e^eps - 1)(E + 1)/(E - 1))``, ``E = e^eps_B``
  (:func:`boundary_q`; tight: numerical checks over neighbouring pairs attain it).

Exactly what one step releases (:class:`StepOutcome`): one of ``j*``, ``⊥``, ``⊤``; ``charged`` is
the indicator of ``⊤`` (boundary) or of a token (not_prior), a function of that output, so
publishing it is covered.  Noisy counts, ``pi`` and ``u`` are never released.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, get_args

import numpy as np

from wasp_vllm.hotpate.bounds import (
    THEOREM,
    boundary_q,
    check_unit,
    laplace_sf,
    not_prior_q,
    plain_composition_epsilon,
    stability_delta,
    tct_epsilon,
    wrapper_epsilon,
)

Wrapper = Literal["boundary", "not_prior"]
WRAPPERS: tuple[str, ...] = get_args(Wrapper)
#: Multiples of eps_W tried as eps_B for the boundary target (every eps_B >= eps_W is valid).
_EPS_B_FACTORS = (1.0, 1.25, 1.5, 2.0, 3.0)


class TargetBudgetExceeded(RuntimeError):
    """Another call could exceed the target-hit cap (or the call cap); nothing was recorded."""


@dataclass(frozen=True)
class StepOutcome:
    """What one step releases: ``token`` (``None`` for ``⊥`` and ``⊤``) and ``charged`` (a hit)."""

    token: int | None
    charged: bool


@dataclass(frozen=True)
class BoundaryNoisyArgMax:
    """Thresholded noisy argmax for homogeneous ensembles, charged by target (see module doc).

    ``scale``: Laplace ``b``; ``margin``: ``T - n/2`` (use :func:`stability_margin`);
    ``gamma``: boundary charging rate; ``votes_changed``: votes one record can move.
    """

    scale: float
    margin: float
    gamma: float = 0.5
    votes_changed: int = 1
    wrapper: Wrapper = "boundary"

    def __post_init__(self) -> None:
        if self.scale <= 0 or self.votes_changed < 1 or self.wrapper not in WRAPPERS:
            raise ValueError("need scale > 0, votes_changed >= 1 and wrapper in " + str(WRAPPERS))
        check_unit("gamma", self.gamma)

    @property
    def eps_test(self) -> float:
        """DP level of the bare Laplace test: ``Delta / b``."""
        return self.votes_changed / self.scale

    @property
    def eps_step(self) -> float:
        """DP level of one released step (wrapped for ``boundary``)."""
        if self.wrapper == "boundary":
            return wrapper_epsilon(self.eps_test, self.gamma)
        return self.eps_test

    @property
    def delta_per_call(self) -> float:
        """Stability ``delta_s`` paid on every call."""
        gamma = self.gamma if self.wrapper == "boundary" else 0.0
        return stability_delta(self.margin, self.scale, gamma, self.votes_changed)

    def targets(self) -> list[tuple[float, float]]:
        """Valid ``(q, eps_B)`` pairs for :func:`tct_epsilon`."""
        if self.wrapper == "not_prior":
            return [(not_prior_q(self.eps_test), self.eps_test)]
        eps_w = self.eps_step
        return [(boundary_q(self.eps_test, self.gamma, f * eps_w), f * eps_w) for f in _EPS_B_FACTORS]

    def threshold(self, n_teachers: int) -> float:
        """The absolute count ``T = n/2 + margin`` the noisy top count must reach."""
        return n_teachers / 2.0 + self.margin

    def _top(self, tokens: np.ndarray, counts: np.ndarray, n_teachers: int) -> tuple[int, int]:
        tokens, counts = np.asarray(tokens, dtype=np.int64), np.asarray(counts, dtype=np.int64)
        if tokens.shape != counts.shape or tokens.ndim != 1 or tokens.size == 0:
            raise ValueError("tokens and counts must be equal-length, non-empty 1-d arrays")
        if counts.min() < 0 or int(counts.sum()) != n_teachers:
            raise ValueError("counts must be >= 0 and sum to n_teachers (one vote per teacher)")
        c_max = int(counts.max())
        return int(tokens[counts == c_max].min()), c_max

    def outcome_probabilities(
        self, tokens: np.ndarray, counts: np.ndarray, n_teachers: int
    ) -> dict[str, Any]:
        """Exact law of the step (for tests and audits only: these numbers are private)."""
        top, c_max = self._top(tokens, counts, n_teachers)
        pi = laplace_sf(self.threshold(n_teachers) - c_max, self.scale)
        charge = self.gamma * min(pi, 1.0 - pi) if self.wrapper == "boundary" else 0.0
        token = (1.0 - charge) * pi
        hit = charge if self.wrapper == "boundary" else token
        return {"token": top, "p_token": token, "p_bottom": 1.0 - charge - token, "p_charge": hit}

    def __call__(
        self,
        tokens: np.ndarray,
        counts: np.ndarray,
        n_teachers: int,
        secret_rng: np.random.Generator,
        public_rng: np.random.Generator | None = None,
    ) -> StepOutcome:
        """One step on the sparse histogram; all draws from ``secret_rng`` (each depends on the
        private counts).  ``public_rng`` is accepted for interface symmetry and unused: there is
        no post-processing randomness in this step."""
        top, c_max = self._top(tokens, counts, n_teachers)
        threshold = self.threshold(n_teachers)
        if self.wrapper == "boundary":
            pi = laplace_sf(threshold - c_max, self.scale)
            if secret_rng.random() < self.gamma * min(pi, 1.0 - pi):
                return StepOutcome(None, True)
        passed = c_max + secret_rng.laplace(0.0, self.scale) >= threshold
        token = top if passed else None
        return StepOutcome(token, bool(passed) and self.wrapper == "not_prior")


class TargetChargingAccountant:
    """Counts calls and target hits of one :class:`BoundaryNoisyArgMax` run under a fixed budget.

    The cap ``max_hits`` is the largest ``tau`` with ``tct_epsilon(tau) <= epsilon``; it depends on
    public parameters only, so the guarantee of the run is ``(tct_epsilon(max_hits), delta)``
    however early it stops.  When plain composition of ``max_calls`` steps already fits the budget,
    that analysis is used instead and no hit cap binds (both bounds hold for the same run, so the
    smaller one is the guarantee).  Ask :meth:`can_call` *before* each step (it may be a hit).
    """

    def __init__(self, mechanism: BoundaryNoisyArgMax, epsilon: float, delta: float, max_calls: int) -> None:
        if epsilon <= 0 or not 0.0 < delta < 1.0 or max_calls < 1:
            raise ValueError("need epsilon > 0, 0 < delta < 1 and max_calls >= 1")
        self.mechanism, self.epsilon, self.delta, self.max_calls = mechanism, epsilon, delta, max_calls
        self.delta_bad = max_calls * mechanism.delta_per_call
        if self.delta_bad >= delta / 2.0:
            raise ValueError("margin too small: the calls' stability deltas use half of delta or more")
        self._targets = mechanism.targets()
        self.epsilon_plain = plain_composition_epsilon(
            max_calls, mechanism.eps_step, delta, mechanism.delta_per_call
        )
        self.max_hits = max_calls if self.epsilon_plain <= epsilon else self._find_max_hits()
        self.calls = 0
        self.hits = 0

    def epsilon_for_hits(self, hits: int, delta: float | None = None) -> float:
        """The TCT epsilon of a run capped at ``hits`` target hits (overall ``delta``)."""
        return tct_epsilon(hits, self._targets, self.delta if delta is None else delta, self.delta_bad)

    def epsilon_guaranteed(self) -> float:
        """The run's epsilon: the smaller of the TCT bound at the cap and plain composition."""
        return min(self.epsilon_for_hits(self.max_hits), self.epsilon_plain)

    def _find_max_hits(self) -> int:
        lo, hi = 0, 1
        while self.epsilon_for_hits(hi) <= self.epsilon:
            lo, hi = hi, hi * 2
            if lo >= self.max_calls:
                return self.max_calls
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if self.epsilon_for_hits(mid) <= self.epsilon else (lo, mid)
        return min(lo, self.max_calls)

    def can_call(self) -> bool:
        """True when one more step, even if it is a hit, stays within the cap."""
        return self.calls < self.max_calls and self.hits < self.max_hits

    def record(self, outcome: StepOutcome) -> None:
        """Record a step that :meth:`can_call` allowed; raises if it was not allowed."""
        if not self.can_call():
            raise TargetBudgetExceeded(f"cap reached: {self.hits}/{self.max_hits} hits, {self.calls} calls")
        self.calls += 1
        self.hits += int(outcome.charged)

    def epsilon_spent(self, delta: float | None = None) -> float:
        """Odometer reading: the TCT epsilon had the cap been the hits used so far (not itself a
        DP guarantee, since the count of hits depends on the data; the guarantee is the cap's)."""
        return self.epsilon_for_hits(self.hits, delta)

    def report(self) -> dict[str, Any]:
        """Manifest entry: the guarantee, its parameters, and the plain-composition comparison."""
        m, guaranteed = self.mechanism, self.epsilon_guaranteed()
        plain_binds = self.epsilon_plain <= self.epsilon_for_hits(self.max_hits)
        plain = {
            f"plain_composition_epsilon_{k}": plain_composition_epsilon(c, e, self.delta, m.delta_per_call)
            for k, c, e in (("calls", self.calls, m.eps_step), ("bare_test_calls", self.calls, m.eps_test))
        }
        return {
            "accountant": "target_charging",
            "analysis": "plain composition of max_calls steps" if plain_binds else THEOREM,
            "wrapper": m.wrapper,
            "guarantee": f"({guaranteed:.4g}, {self.delta:.3g})-DP for the run (cap {self.max_hits} hits)",
            "epsilon_budget": self.epsilon,
            "epsilon_guaranteed": guaranteed,
            "delta": self.delta,
            "epsilon_at_hits_used": self.epsilon_spent(),
            "calls": self.calls,
            "max_calls": self.max_calls,
            "hits": self.hits,
            "max_hits": self.max_hits,
            "laplace_scale": m.scale,
            "margin": m.margin,
            "gamma": m.gamma if m.wrapper == "boundary" else None,
            "votes_changed": m.votes_changed,
            "eps_test": m.eps_test,
            "eps_step": m.eps_step,
            "targets_q_eps": self._targets,
            "delta_per_call": m.delta_per_call,
            "plain_composition_epsilon_max_calls": self.epsilon_plain,
            **plain,
        }
