"""The private step of one Hot PATE call and what pays for it: two interchangeable accountings.

A *step* reads one vote histogram of a label's teachers (the only private input) and returns a
token or nothing; before every call the step's accountant says whether the budget allows it.

* :class:`GaussianStep` (``accounting="gaussian"``, pays for queries): one Gaussian release of the
  dense histogram (:mod:`.aggregators`), recorded on a :class:`PrivacyLedger` *before* it happens.
  ``K`` releases of L2 sensitivity ``Delta`` at noise ``sigma`` compose exactly into one Gaussian
  mechanism with ``mu = Delta sqrt(K) / sigma``, whatever they returned.
* :class:`ChargedStep` (``accounting="target-charging"``, pays for yields): the thresholded stable
  argmax of :mod:`.accounting` (a Laplace test on the top count, then the true top token) under the
  target-charging accountant: a call returning ``⊥`` is free, a call is charged (``⊤``) only with
  probability ``gamma min(pi, 1 - pi)``, ``pi`` its pass probability.  Its fixed costs (a stability
  margin of ~20 noise scales on every call, ~``ln(1/delta)/q`` private draws per hit) need many
  teachers: see ``docs/research/hotpate_accounting.md``.

**One budget per label ensemble.**  Every private record sits in one teacher of its own label's
ensemble, and the ensembles of different labels are disjoint.  Each label gets its own accountant
with the per-label budget of :func:`label_budget`; the run's guarantee follows:

* add/remove: one record changes one teacher of one ensemble, so only that ensemble's calls see a
  difference (parallel composition): the run is ``(eps, delta)``-DP when every label's accountant
  is (Gaussian: sensitivity ``sqrt 2``; target charging: ``Delta = 1`` vote).
* replace (an ``--m`` draw): two records change, in one ensemble (two teachers) or in two.
  Gaussian: two teachers of *one* ensemble can move their votes the same way (both ``x -> y``, which
  coordinated sampling makes the typical case), so that ensemble's histogram moves by
  ``(-2, +2)``: L2 norm ``2 sqrt 2``.  Each label's ledger uses sensitivity ``2 sqrt 2`` and the
  whole budget, so its releases are at most ``K`` with ``mu^2 = 8K/sigma^2 <= mu*^2``; two ensembles
  at ``sqrt 2`` each give ``mu^2 = 2K/sigma^2 + 2K/sigma^2``, less (Gaussian DP composes exactly and
  adaptively), so the run is ``(eps, delta)``-DP.  Target charging: each label is calibrated for
  ``Delta = 2`` votes on the top count at ``(eps/2, delta/2)``; two ensembles compose basically to
  ``(eps, delta)``.

**Noise from a public threshold fraction.**  With ``n`` teachers and ``V`` tokens the default
homogeneous threshold is set to ``f n`` (``threshold_fraction`` ``f``, public):

* Gaussian: ``n/2 + sigma z(beta/V) = f n``, i.e. ``sigma = (f - 1/2) n / z(beta/V)``; the ledger
  then allows ``K = floor((mu* sigma / Delta)^2)`` releases (:func:`gaussian_release_cap`).
* target charging: ``n/2 + Delta + b ln((1+gamma)/(2 delta_s)) = f n`` with ``delta_s`` the per-call
  stability delta (``stability_share * delta / max_calls``), i.e. :func:`charging_scale`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import numpy as np
from scipy.special import ndtr, ndtri

from wasp_vllm.hotpate.accounting import BoundaryNoisyArgMax, StepOutcome, TargetChargingAccountant, Wrapper
from wasp_vllm.hotpate.aggregators import VOTE_SENSITIVITY, Aggregator
from wasp_vllm.hotpate.bounds import laplace_sf, stability_margin
from wasp_vllm.hotpate.ensembles import VoteHistogram
from wasp_vllm.privacy.accountant import GaussianRelease, Neighbour, PrivacyBudgetExceeded, PrivacyLedger
from wasp_vllm.privacy.gaussian import epsilon_for_sigma, mu_for_epsilon

Accounting = Literal["gaussian", "target-charging"]
ACCOUNTINGS: tuple[str, ...] = ("gaussian", "target-charging")
#: Below this chance of clearing the threshold, a call is not worth its privacy cost.
UNREACHABLE_P = 1e-9


def vote_sensitivity(neighbour: Neighbour | str) -> float:
    """L2 sensitivity of one label's dense histogram: one record is in one teacher, whose vote moves
    from one bin to another (``sqrt 2``); a replaced record changes two teachers of one ensemble, and
    both may move ``x -> y`` (``(-2, +2)``: ``2 sqrt 2``; ``tests/test_hotpate_sensitivity.py``)."""
    if neighbour == "add_remove":
        return VOTE_SENSITIVITY
    if neighbour == "replace":
        return 2.0 * VOTE_SENSITIVITY
    raise ValueError(f"neighbour must be 'add_remove' or 'replace', got {neighbour!r}")


class PrivateStep(Protocol):
    """One private aggregation call and its accounting (see the module docstring)."""

    name: str
    calls: int

    def unreachable(self, n_teachers: int, vocab_size: int) -> bool:
        """True when even ``n`` unanimous votes would almost never yield (public quantities only)."""
        ...

    def reserve(self) -> bool:
        """Before a call: may it happen?  False when the budget (or the call cap) is spent."""
        ...

    def release(
        self, hist: VoteHistogram, rng: np.random.Generator, noise_rng: np.random.Generator
    ) -> StepOutcome:
        """The private call: noise from ``noise_rng`` only; ``rng`` for public post-processing."""
        ...

    def settle(self, outcome: StepOutcome) -> None:
        """After a call: record what it charged."""
        ...

    def report(self) -> dict[str, Any]: ...


# --------------------------------------------------------------------------------------------
# budgets and calibration (public quantities only)
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LabelBudget:
    """What each label's accountant may spend, and how the labels compose to the run's guarantee."""

    epsilon: float
    delta: float
    votes_changed: int
    sensitivity: float
    composition: str


def label_budget(accounting: str, neighbour: str, epsilon: float, delta: float) -> LabelBudget:
    """Per-label budget such that the whole run is ``(epsilon, delta)``-DP (module docstring)."""
    if accounting not in ACCOUNTINGS:
        raise ValueError(f"accounting must be one of {ACCOUNTINGS}, got {accounting!r}")
    sens = vote_sensitivity(neighbour)
    if neighbour == "add_remove":
        return LabelBudget(epsilon, delta, 1, sens, "parallel: one record is in one label's ensemble")
    if accounting == "gaussian":
        text = "replace: one ensemble at sensitivity 2 sqrt 2, or two at sqrt 2 each (less), per label ledger"
        return LabelBudget(epsilon, delta, 2, sens, text)
    text = "replace: at most two ensembles, each (eps/2, delta/2) at Delta = 2 (basic composition)"
    return LabelBudget(epsilon / 2.0, delta / 2.0, 2, sens, text)


def gaussian_sigma(n_teachers: int, vocab_size: int, fraction: float, beta: float) -> float:
    """``sigma = (f - 1/2) n / z(beta / V)``: the default threshold ``n/2 + L`` is then ``f n``."""
    if not 0.5 < fraction <= 1.0:
        raise ValueError("threshold_fraction must be in (0.5, 1]")
    return (fraction - 0.5) * n_teachers / float(-ndtri(beta / vocab_size))


def gaussian_release_cap(sigma: float, sensitivity: float, epsilon: float, delta: float) -> int:
    """Most releases at ``sigma`` within ``(epsilon, delta)``: ``floor((mu* sigma / Delta)^2)``."""
    cap = int(math.floor((mu_for_epsilon(epsilon, delta) * sigma / sensitivity) ** 2))
    while cap > 0 and epsilon_for_sigma(sigma, delta, sensitivity, cap) > epsilon:
        cap -= 1  # float round-off at the boundary: the exact accountant decides
    return cap


def charging_scale(
    n_teachers: int, fraction: float, delta_s: float, gamma: float, votes_changed: int
) -> float:
    """Laplace ``b`` with ``n/2 + stability_margin(b) = f n``, i.e.
    ``b = (f n - n/2 - Delta) / ln((1 + gamma) / (2 delta_s))``."""
    if not 0.5 < fraction <= 1.0:
        raise ValueError("threshold_fraction must be in (0.5, 1]")
    room = (fraction - 0.5) * n_teachers - votes_changed
    return max(room, 1e-3) / math.log((1.0 + gamma) / (2.0 * delta_s))


# --------------------------------------------------------------------------------------------
# the two steps
# --------------------------------------------------------------------------------------------


class GaussianStep:
    """One Gaussian release of the dense histogram per call, charged on the ledger before it happens."""

    name = "gaussian"

    def __init__(
        self,
        aggregator: Aggregator,
        ledger: PrivacyLedger | None = None,
        neighbour: Neighbour | str = Neighbour.ADD_REMOVE,
    ) -> None:
        if ledger is not None and aggregator.sigma <= 0:
            raise ValueError("a privacy ledger needs sigma > 0 (sigma 0 releases the true histogram)")
        self.aggregator, self.ledger, self.neighbour = aggregator, ledger, neighbour
        self.sensitivity = vote_sensitivity(neighbour)
        self.calls = 0

    def unreachable(self, n_teachers: int, vocab_size: int) -> bool:
        threshold = self.aggregator.resolve_threshold(n_teachers, vocab_size)
        sigma = self.aggregator.sigma
        if sigma == 0:
            return threshold > n_teachers
        return bool(ndtr((n_teachers - threshold) / sigma) < UNREACHABLE_P)  # norm.sf(x) is ndtr(-x)

    def reserve(self) -> bool:
        if self.ledger is not None:
            release = GaussianRelease(self.calls, self.aggregator.sigma, self.sensitivity, self.neighbour)
            try:
                self.ledger.record(release)
            except PrivacyBudgetExceeded:
                return False
        self.calls += 1
        return True

    def release(
        self, hist: VoteHistogram, rng: np.random.Generator, noise_rng: np.random.Generator
    ) -> StepOutcome:
        result = self.aggregator(hist, rng, noise_rng)
        return StepOutcome(result.token, True)  # every release is charged, whatever it returned

    def settle(self, outcome: StepOutcome) -> None:
        del outcome  # charged in reserve()

    def cap(self) -> int | None:
        """Releases the ledger will allow in all (None without a ledger)."""
        if self.ledger is None:
            return None
        return gaussian_release_cap(
            self.aggregator.sigma, self.sensitivity, self.ledger.epsilon, self.ledger.delta
        )

    def report(self) -> dict[str, Any]:
        spent = self.ledger.spent_epsilon() if self.ledger is not None else None
        return {"accountant": "gaussian_ledger", "calls": self.calls, "releases_cap": self.cap(),
                "sigma": self.aggregator.sigma, "sensitivity": self.sensitivity,
                "epsilon_at_calls_used": spent}  # fmt: skip


class ChargedStep:
    """accounting.py's stable thresholded argmax under its target-charging accountant."""

    name = "target_charging"

    def __init__(
        self, mechanism: BoundaryNoisyArgMax, accountant: TargetChargingAccountant | None = None
    ) -> None:
        self.mechanism, self.accountant = mechanism, accountant
        self.calls = 0

    def unreachable(self, n_teachers: int, vocab_size: int) -> bool:
        del vocab_size  # no vocabulary-wide noise: a token nobody voted for can never come out
        gap = self.mechanism.threshold(n_teachers) - n_teachers
        return laplace_sf(gap, self.mechanism.scale) < UNREACHABLE_P

    def reserve(self) -> bool:
        return self.accountant is None or self.accountant.can_call()

    def release(
        self, hist: VoteHistogram, rng: np.random.Generator, noise_rng: np.random.Generator
    ) -> StepOutcome:
        del rng  # the step has no public post-processing randomness
        return self.mechanism(hist.tokens, hist.counts, hist.n_teachers, noise_rng)

    def settle(self, outcome: StepOutcome) -> None:
        self.calls += 1
        if self.accountant is not None:
            self.accountant.record(outcome)

    def report(self) -> dict[str, Any]:
        if self.accountant is None:
            return {"accountant": "none", "calls": self.calls}
        return self.accountant.report()


def charged_step(
    n_teachers: int,
    budget: LabelBudget,
    max_calls: int,
    fraction: float,
    gamma: float = 0.5,
    wrapper: Wrapper = "boundary",
    stability_share: float = 0.1,
) -> ChargedStep:
    """A :class:`ChargedStep` for one label: ``b`` from the threshold fraction, per-call stability
    ``delta_s = stability_share * delta / max_calls`` (so the calls' failures use that share of delta)."""
    if not 0.0 < stability_share < 0.5:
        raise ValueError("stability_share must be in (0, 0.5)")
    g = gamma if wrapper == "boundary" else 0.0
    delta_s = stability_share * budget.delta / max_calls
    scale = charging_scale(n_teachers, fraction, delta_s, g, budget.votes_changed)
    margin = stability_margin(scale, delta_s, g, budget.votes_changed)
    mechanism = BoundaryNoisyArgMax(scale, margin, gamma, budget.votes_changed, wrapper)
    return ChargedStep(
        mechanism, TargetChargingAccountant(mechanism, budget.epsilon, budget.delta, max_calls)
    )
