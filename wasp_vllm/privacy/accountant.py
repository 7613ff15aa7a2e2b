"""Privacy accounting for WASP's noisy voting rounds.

Every voting round releases the concatenated histogram ``(H_near, H_far)`` through a Gaussian
mechanism.  Two accountants are offered (see ``/work/shared/DESIGN.md``):

* ``exact`` (default): the ``T - 1`` Gaussian releases compose *exactly* into one Gaussian
  mechanism with ``mu = sqrt(sum_i (Delta_i / sigma_i)^2)`` (Dong, Roth & Su 2019, Gaussian DP),
  and the tight (epsilon, delta) curve of a Gaussian mechanism is the analytic Gaussian
  mechanism of Balle & Wang (2018)::

      delta(eps) = Phi(mu/2 - eps/mu) - e^eps * Phi(-mu/2 - eps/mu)

* ``paper``: the formula printed in the WASP paper,
  ``sigma = 4 * sqrt(2 ln(1.25/delta)) * sqrt(T - 1) / epsilon``.  It is reported so a run can be
  compared with the paper, never because it is tighter (it is not).

All numerics work on ``log(delta)`` with ``scipy.special.log_ndtr`` / ``erfcx`` so that epsilon from
0.01 to 100 and delta from 1e-12 to 0.5 neither overflow nor cancel.  Calibration is done by
bisection in log space and always returns the *conservative* end of the final bracket (a sigma
that is never too small, an epsilon that is never too small).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import Any, Literal

import numpy as np
from scipy.special import erfcx, log_ndtr

logger = logging.getLogger(__name__)


class Neighbour(str, Enum):
    """How two neighbouring data sets differ: one unit more or less, or one unit changed."""

    ADD_REMOVE = "add_remove"
    REPLACE = "replace"


Mode = Literal["exact", "paper"]

NEIGHBOURS: tuple[str, ...] = ("add_remove", "replace")
MODES: tuple[str, ...] = ("exact", "paper")

#: Relative slack allowed when comparing spent epsilon with the budget (float round-off only).
BUDGET_RTOL = 1e-9
#: The constant in the paper's sigma formula (its per-record sensitivity bound).
PAPER_CONSTANT = 4.0
_SQRT2 = math.sqrt(2.0)


class PrivacyBudgetExceeded(RuntimeError):
    """A release would push the spent epsilon over the budget; nothing was recorded."""


# --------------------------------------------------------------------------------------------
# argument validation
# --------------------------------------------------------------------------------------------


def _check_positive(name: str, value: float) -> float:
    """Reject non-numbers, NaN, inf and non-positive values with a message naming the argument."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ValueError(f"{name} must be a real number, got {type(value).__name__}")
    value = float(value)
    if not math.isfinite(value) or value <= 0.0:
        raise ValueError(f"{name} must be finite and > 0, got {value!r}")
    return value


def _check_delta(delta: float) -> float:
    delta = _check_positive("delta", delta)
    if delta >= 1.0:
        raise ValueError(f"delta must be in (0, 1), got {delta!r}")
    return delta


def _check_int(name: str, value: int, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"{name} must be an integer, got {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return int(value)


def _check_neighbour(neighbour: str) -> str:
    if neighbour not in NEIGHBOURS:
        raise ValueError(f"neighbour must be one of {NEIGHBOURS}, got {neighbour!r}")
    return Neighbour(neighbour).value


def _check_mode(mode: str) -> str:
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    return mode


# --------------------------------------------------------------------------------------------
# sensitivity
# --------------------------------------------------------------------------------------------


def wasp_sensitivity(q: int, neighbour: Neighbour = "add_remove", records_per_unit: int = 1) -> float:
    """L2 sensitivity of the concatenated ``(H_near, H_far)`` vote vector.

    One private record puts weights ``1, 1/2, ..., 1/2^(q-1)`` on ``q`` distinct synthetic samples in
    each histogram, so its vote vector has squared norm ``2 * sum_r 4^-r = 8/3 (1 - 4^-q)``; votes of
    different records are independent, so adding/removing one record moves the vector by exactly
    that.  Replacing a record removes one non-negative vote vector and adds another; their inner
    product is >= 0, so the move is at most ``sqrt(2)`` times that (attained by disjoint supports).
    A unit (user) of ``records_per_unit`` records moves it by at most that many times (triangle
    inequality).
    """
    q = _check_int("q", q, 1)
    neighbour = _check_neighbour(neighbour)
    records_per_unit = _check_int("records_per_unit", records_per_unit, 1)
    base = math.sqrt(8.0 / 3.0 * (1.0 - 4.0 ** (-q)))
    if neighbour == "replace":
        base *= _SQRT2
    return base * records_per_unit


# --------------------------------------------------------------------------------------------
# the analytic Gaussian mechanism
# --------------------------------------------------------------------------------------------


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
    epsilon = _check_positive("epsilon", epsilon)
    delta = _check_delta(delta)
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
    mu = _check_positive("mu", mu)
    delta = _check_delta(delta)
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
    sensitivity = _check_positive("sensitivity", sensitivity)
    compositions = _check_int("compositions", compositions, 1)
    mu = mu_for_epsilon(epsilon, delta)
    # Divide by the (conservatively small) mu; nudge up by one ulp so rounding never undershoots.
    return math.nextafter(sensitivity * math.sqrt(compositions) / mu, math.inf)


def epsilon_for_sigma(sigma: float, delta: float, sensitivity: float, compositions: int) -> float:
    """Epsilon spent by ``compositions`` Gaussian releases with noise ``sigma`` (inverse of calibrate)."""
    sigma = _check_positive("sigma", sigma)
    sensitivity = _check_positive("sensitivity", sensitivity)
    compositions = _check_int("compositions", compositions, 1)
    return epsilon_for_mu(sensitivity * math.sqrt(compositions) / sigma, delta)


# --------------------------------------------------------------------------------------------
# the paper's formula
# --------------------------------------------------------------------------------------------


def paper_sigma(epsilon: float, delta: float, rounds: int) -> float:
    """Sigma exactly as printed in the WASP paper: ``4 sqrt(2 ln(1.25/delta)) sqrt(T-1) / epsilon``."""
    epsilon = _check_positive("epsilon", epsilon)
    delta = _check_delta(delta)
    rounds = _check_int("rounds", rounds, 2)
    return PAPER_CONSTANT * math.sqrt(2.0 * math.log(1.25 / delta)) * math.sqrt(rounds - 1) / epsilon


def paper_epsilon(sigma: float, delta: float, rounds: int) -> float:
    """The epsilon the paper's formula claims for noise ``sigma`` (inverse of :func:`paper_sigma`)."""
    sigma = _check_positive("sigma", sigma)
    delta = _check_delta(delta)
    rounds = _check_int("rounds", rounds, 2)
    return PAPER_CONSTANT * math.sqrt(2.0 * math.log(1.25 / delta)) * math.sqrt(rounds - 1) / sigma


# --------------------------------------------------------------------------------------------
# planning a run
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PrivacyPlan:
    """Noise scale and bookkeeping for a whole run, fixed before any private data is touched.

    ``compositions = rounds - 1`` (the last round is never voted on).  With ``rounds == 1`` there
    is no voting at all: ``sigma`` is ``None`` and both epsilons are 0.0 - no noise is needed
    because nothing private is released.
    """

    epsilon: float
    delta: float
    rounds: int
    q: int
    mode: str
    neighbour: str
    records_per_unit: int
    sensitivity: float
    compositions: int
    sigma: float | None
    epsilon_exact_spent: float
    epsilon_paper_claimed: float

    @property
    def needs_noise(self) -> bool:
        """True when at least one voting round releases private information."""
        return self.compositions > 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def paper_epsilon_for_releases(sigmas: list[float], scales: list[float], delta: float) -> float:
    """The paper's epsilon generalised to heterogeneous releases.

    The printed formula is the classical Gaussian mechanism bound ``eps = Delta_eff sqrt(2 ln(1.25/
    delta)) / sigma`` with ``Delta_eff = 4 sqrt(T-1)``, i.e. per-round sensitivity 4 composed in L2.
    For releases with noise ``sigma_i`` and sensitivity scale ``c_i`` (records per unit) this reads
    ``eps = 4 sqrt(2 ln(1.25/delta)) sqrt(sum_i (c_i/sigma_i)^2)``, which is exactly the printed
    formula when all sigmas are equal and ``c_i = 1``.
    """
    delta = _check_delta(delta)
    if not sigmas:
        return 0.0
    total = math.fsum((c / s) ** 2 for s, c in zip(sigmas, scales, strict=True))
    return PAPER_CONSTANT * math.sqrt(2.0 * math.log(1.25 / delta)) * math.sqrt(total)


def plan_privacy(
    epsilon: float,
    delta: float,
    rounds: int,
    q: int,
    mode: Mode = "exact",
    neighbour: Neighbour = "add_remove",
    records_per_unit: int = 1,
) -> PrivacyPlan:
    """Choose sigma for a run of ``rounds`` rounds with ``q`` votes per private sample.

    ``exact`` calibrates with the analytic Gaussian mechanism on the exact sensitivity; ``paper``
    uses the printed formula (scaled by ``records_per_unit`` for user-level privacy; the paper's
    formula does not depend on the neighbour relation).  Both epsilons are always reported.
    """
    epsilon = _check_positive("epsilon", epsilon)
    delta = _check_delta(delta)
    rounds = _check_int("rounds", rounds, 1)
    mode = _check_mode(mode)
    sensitivity = wasp_sensitivity(q, neighbour, records_per_unit)
    compositions = rounds - 1
    if compositions == 0:
        logger.info("rounds == 1: no voting round, no noise needed, no privacy spent")
        return PrivacyPlan(
            epsilon, delta, rounds, q, mode, neighbour, records_per_unit, sensitivity, 0, None, 0.0, 0.0
        )
    if mode == "exact":
        sigma = calibrate_sigma(epsilon, delta, sensitivity, compositions)
    else:
        sigma = paper_sigma(epsilon, delta, rounds) * records_per_unit
    eps_exact = epsilon_for_sigma(sigma, delta, sensitivity, compositions)
    if eps_exact > epsilon * (1.0 + BUDGET_RTOL):
        raise PrivacyBudgetExceeded(
            f"the paper's formula under-noises at epsilon={epsilon:g}: its sigma={sigma:.4g} spends "
            f"epsilon={eps_exact:.4g} by the exact accountant (the formula is proven for epsilon < 1 "
            "only); use --accountant exact"
        )
    eps_paper = paper_epsilon_for_releases(
        [sigma] * compositions, [float(records_per_unit)] * compositions, delta
    )
    logger.info(
        "privacy plan: mode=%s sigma=%.6g compositions=%d exact eps=%.6g paper eps=%.6g",
        mode,
        sigma,
        compositions,
        eps_exact,
        eps_paper,
    )
    return PrivacyPlan(
        epsilon,
        delta,
        rounds,
        q,
        mode,
        neighbour,
        records_per_unit,
        sensitivity,
        compositions,
        sigma,
        eps_exact,
        eps_paper,
    )


# --------------------------------------------------------------------------------------------
# the ledger
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Release:
    """One Gaussian release of the vote histograms.

    ``sensitivity`` is the full L2 sensitivity of this release under ``neighbour`` and
    ``records_per_unit`` (i.e. ``wasp_sensitivity(q, neighbour, records_per_unit)``); the other two
    fields are kept for the manifest and for the paper-mode scale.
    """

    round: int
    sigma: float
    sensitivity: float
    neighbour: str
    records_per_unit: int = 1


@dataclass
class PrivacyLedger:
    """Running record of the releases of a run, refusing any release that would exceed the budget.

    Every release is checked with the exact accountant; in ``paper`` mode the paper's formula must
    also stay within the budget (it chose sigma).  Both accountants are always reported.
    Serialise with :meth:`to_dict` / :meth:`from_dict` for checkpoints.
    """

    epsilon: float
    delta: float
    mode: str = "exact"
    releases: list[Release] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.epsilon = _check_positive("epsilon", self.epsilon)
        self.delta = _check_delta(self.delta)
        self.mode = _check_mode(self.mode)
        self.releases = [r if isinstance(r, Release) else Release(**r) for r in self.releases]

    # -- accounting ---------------------------------------------------------------------------

    @staticmethod
    def _exact(releases: list[Release], delta: float) -> float:
        if not releases:
            return 0.0
        mu = math.sqrt(math.fsum((r.sensitivity / r.sigma) ** 2 for r in releases))
        return epsilon_for_mu(mu, delta)

    @staticmethod
    def _paper(releases: list[Release], delta: float) -> float:
        return paper_epsilon_for_releases(
            [r.sigma for r in releases], [float(r.records_per_unit) for r in releases], delta
        )

    def spent_epsilon(self) -> float:
        """Epsilon spent so far: always the exact composition of the Gaussian releases.

        This is the guarantee, whichever formula chose sigma: the paper's classic bound is proven
        only for epsilon < 1, so a paper-mode run is held to the exact accountant too.
        """
        return self._exact(self.releases, self.delta)

    def spent_epsilon_exact(self) -> float:
        return self._exact(self.releases, self.delta)

    def spent_epsilon_paper(self) -> float:
        return self._paper(self.releases, self.delta)

    def remaining_epsilon(self) -> float:
        return max(0.0, self.epsilon - self.spent_epsilon())

    def record(
        self, round: int, sigma: float, sensitivity: float, neighbour: Neighbour, records_per_unit: int = 1
    ) -> Release:
        """Append one release; raises :class:`PrivacyBudgetExceeded` *before* appending if it would
        push the spent epsilon (exact, and the paper's in paper mode) over the budget by more than
        ``BUDGET_RTOL``."""
        release = Release(
            round=_check_int("round", round, 0),
            sigma=_check_positive("sigma", sigma),
            sensitivity=_check_positive("sensitivity", sensitivity),
            neighbour=_check_neighbour(neighbour),
            records_per_unit=_check_int("records_per_unit", records_per_unit, 1),
        )
        after = self._exact([*self.releases, release], self.delta)
        claimed = self._paper([*self.releases, release], self.delta) if self.mode == "paper" else after
        if max(after, claimed) > self.epsilon * (1.0 + BUDGET_RTOL):
            raise PrivacyBudgetExceeded(
                f"release for round {release.round} would spend epsilon={after:.6g} "
                f"(exact accountant; {claimed:.6g} by the {self.mode} formula) over the budget "
                f"epsilon={self.epsilon:.6g}"
            )
        self.releases.append(release)
        logger.debug(
            "privacy ledger: round %d recorded, spent epsilon %.6g of %.6g (%s)",
            release.round,
            after,
            self.epsilon,
            self.mode,
        )
        return release

    # -- reporting and checkpoints ----------------------------------------------------------------

    def report(self) -> dict[str, Any]:
        """Summary for the run manifest: budget, spend under both accountants, noise, sensitivity."""
        sigmas = [r.sigma for r in self.releases]
        sens = sorted({r.sensitivity for r in self.releases})
        neighbours = sorted({r.neighbour for r in self.releases})
        units = sorted({r.records_per_unit for r in self.releases})
        return {
            "mode": self.mode,
            "epsilon_budget": self.epsilon,
            "delta": self.delta,
            "epsilon_spent": self.spent_epsilon(),
            "epsilon_spent_exact": self.spent_epsilon_exact(),
            "epsilon_spent_paper": self.spent_epsilon_paper(),
            "compositions": len(self.releases),
            "sigma": sigmas[0] if len(set(sigmas)) == 1 else None,
            "sigmas": sigmas,
            "sensitivity": sens[0] if len(sens) == 1 else sens,
            "neighbour": neighbours[0] if len(neighbours) == 1 else neighbours,
            "records_per_unit": units[0] if len(units) == 1 else units,
            "rounds": [r.round for r in self.releases],
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            "epsilon": self.epsilon,
            "delta": self.delta,
            "mode": self.mode,
            "releases": [asdict(r) for r in self.releases],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PrivacyLedger:
        return cls(
            epsilon=data["epsilon"],
            delta=data["delta"],
            mode=data.get("mode", "exact"),
            releases=[Release(**r) for r in data.get("releases", [])],
        )
