"""Privacy accounting for WASP's voting rounds: releases as values, accountants as composers.

Every voting round releases the concatenated histogram ``(H_near, H_far)`` through a Gaussian
mechanism: one immutable :class:`GaussianRelease`.  An :class:`Accountant` composes releases and
answers two questions, epsilon spent at a delta, and the sigma that meets a target epsilon:

* :class:`ExactAccountant` (default): the releases compose exactly into one Gaussian mechanism
  (Gaussian DP) whose tight curve is the analytic Gaussian mechanism (:mod:`.gaussian`).
* :class:`PaperAccountant`: the formula printed in the WASP paper,
  ``sigma = 4 * sqrt(2 ln(1.25/delta)) * sqrt(T - 1) / epsilon``.  It is reported so a run can be
  compared with the paper, never because it is tighter (it is not): the classic bound is proven
  for epsilon < 1 only, so a run that uses it is still held to the exact accountant.

The :class:`PrivacyLedger` holds one accountant, records each release, and refuses a release
that would spend more than the budget (see ``/work/shared/DESIGN.md`` for the reference values).
"""

from __future__ import annotations

import logging
import math
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from wasp_vllm.config.choices import AccountantMode, Neighbour
from wasp_vllm.privacy.gaussian import (
    calibrate_sigma,
    check_delta,
    check_int,
    check_positive,
    epsilon_for_mu,
)

logger = logging.getLogger(__name__)

#: Relative slack allowed when comparing spent epsilon with the budget (float round-off only).
BUDGET_RTOL = 1e-9
#: The constant in the paper's sigma formula (its per-record sensitivity bound).
PAPER_CONSTANT = 4.0


class PrivacyBudgetExceeded(RuntimeError):
    """A release would push the spent epsilon over the budget; nothing was recorded."""


class UnplannedRelease(RuntimeError):
    """A release the run's privacy plan did not make (or made once, and it was recorded); nothing
    was recorded."""


def neighbour_of(value: Neighbour | str) -> Neighbour:
    try:
        return Neighbour(value)
    except ValueError:
        raise ValueError(f"neighbour must be one of {[n.value for n in Neighbour]}, got {value!r}") from None


@dataclass(frozen=True)
class PrivacyUnit:
    """Whom the guarantee protects: one record, or one user holding up to ``records_per_unit``
    records; and how neighbouring data sets differ (a unit added or removed, or replaced)."""

    neighbour: Neighbour | str = Neighbour.ADD_REMOVE
    records_per_unit: int = 1

    def __post_init__(self) -> None:
        object.__setattr__(self, "neighbour", neighbour_of(self.neighbour))
        check_int("records_per_unit", self.records_per_unit, 1)


def wasp_sensitivity(
    q: int, neighbour: Neighbour | str = Neighbour.ADD_REMOVE, records_per_unit: int = 1, histograms: int = 2
) -> float:
    """L2 sensitivity of the released vote vector: ``(H_near, H_far)`` concatenated, or ``H_near``
    alone (``histograms=1``: a run whose prompts never show the far pool releases only that).

    One private record puts weights ``1, 1/2, ..., 1/2^(q-1)`` on ``q`` distinct synthetic samples in
    each histogram, so its vote vector has squared norm ``histograms * sum_r 4^-r``, ``8/3 (1 - 4^-q)``
    for both; votes of different records are independent, so adding/removing one record moves the
    vector by exactly that.  Replacing a record removes one non-negative vote vector and adds
    another; their inner product is >= 0, so the move is at most ``sqrt(2)`` times that (attained
    by disjoint supports).  A unit (user) of ``records_per_unit`` records moves it by at most that
    many times (triangle inequality).
    """
    q = check_int("q", q, 1)
    records_per_unit = check_int("records_per_unit", records_per_unit, 1)
    if isinstance(histograms, bool) or histograms not in (1, 2):
        raise ValueError(f"histograms must be 1 (H_near) or 2 (H_near and H_far), got {histograms!r}")
    base = math.sqrt(histograms * 4.0 / 3.0 * (1.0 - 4.0 ** (-q)))
    if neighbour_of(neighbour) is Neighbour.REPLACE:
        base *= math.sqrt(2.0)
    return base * records_per_unit


@dataclass(frozen=True)
class GaussianRelease:
    """One Gaussian release of the vote histograms.

    ``sensitivity`` is the full L2 sensitivity of this release under ``neighbour`` and
    ``records_per_unit`` (``wasp_sensitivity(q, neighbour, records_per_unit)``); the other two
    fields are kept for the manifest and for the paper's scale.
    """

    round: int
    sigma: float
    sensitivity: float
    neighbour: str
    records_per_unit: int = 1
    #: What was released: the round's "votes", or the "label-prior" histogram of private labels.
    what: str = "votes"

    def __post_init__(self) -> None:
        check_int("round", self.round, 0)
        check_positive("sigma", self.sigma)
        check_positive("sensitivity", self.sensitivity)
        check_int("records_per_unit", self.records_per_unit, 1)
        object.__setattr__(self, "neighbour", neighbour_of(self.neighbour).value)


# --------------------------------------------------------------------------------------------
# accountants
# --------------------------------------------------------------------------------------------


class Accountant(ABC):
    """Composes Gaussian releases into one (epsilon, delta) statement, and calibrates sigma."""

    mode: AccountantMode

    @abstractmethod
    def epsilon(self, releases: Sequence[GaussianRelease], delta: float) -> float:
        """Epsilon spent by ``releases`` at ``delta`` (0 for none)."""

    @abstractmethod
    def sigma(
        self, epsilon: float, delta: float, sensitivity: float, compositions: int, records_per_unit: int
    ) -> float:
        """Noise for ``compositions`` equal releases of L2 ``sensitivity`` to spend ``epsilon``."""


class ExactAccountant(Accountant):
    """Exact composition of Gaussian mechanisms (Gaussian DP) and the analytic Gaussian curve."""

    mode = AccountantMode.EXACT

    def epsilon(self, releases: Sequence[GaussianRelease], delta: float) -> float:
        if not releases:
            return 0.0
        mu = math.sqrt(math.fsum((r.sensitivity / r.sigma) ** 2 for r in releases))
        return epsilon_for_mu(mu, delta)

    def sigma(
        self, epsilon: float, delta: float, sensitivity: float, compositions: int, records_per_unit: int
    ) -> float:
        return calibrate_sigma(epsilon, delta, sensitivity, compositions)


class PaperAccountant(Accountant):
    """The WASP paper's classic Gaussian bound (per-round sensitivity 4 composed in L2)."""

    mode = AccountantMode.PAPER

    def epsilon(self, releases: Sequence[GaussianRelease], delta: float) -> float:
        return paper_epsilon_for_releases(
            [r.sigma for r in releases], [float(r.records_per_unit) for r in releases], delta
        )

    def sigma(
        self, epsilon: float, delta: float, sensitivity: float, compositions: int, records_per_unit: int
    ) -> float:
        # The printed formula does not depend on the neighbour relation; a unit of k records is k times.
        return paper_sigma(epsilon, delta, compositions + 1) * records_per_unit


ACCOUNTANTS: dict[AccountantMode, Accountant] = {a.mode: a for a in (ExactAccountant(), PaperAccountant())}
EXACT = ACCOUNTANTS[AccountantMode.EXACT]


def get_accountant(mode: AccountantMode | str) -> Accountant:
    try:
        return ACCOUNTANTS[AccountantMode(mode)]
    except ValueError:
        raise ValueError(f"mode must be one of {[m.value for m in AccountantMode]}, got {mode!r}") from None


def paper_sigma(epsilon: float, delta: float, rounds: int) -> float:
    """Sigma exactly as printed in the WASP paper: ``4 sqrt(2 ln(1.25/delta)) sqrt(T-1) / epsilon``."""
    epsilon = check_positive("epsilon", epsilon)
    delta = check_delta(delta)
    rounds = check_int("rounds", rounds, 2)
    return PAPER_CONSTANT * math.sqrt(2.0 * math.log(1.25 / delta)) * math.sqrt(rounds - 1) / epsilon


def paper_epsilon(sigma: float, delta: float, rounds: int) -> float:
    """The epsilon the paper's formula claims for noise ``sigma`` (inverse of :func:`paper_sigma`)."""
    sigma = check_positive("sigma", sigma)
    delta = check_delta(delta)
    rounds = check_int("rounds", rounds, 2)
    return PAPER_CONSTANT * math.sqrt(2.0 * math.log(1.25 / delta)) * math.sqrt(rounds - 1) / sigma


def paper_epsilon_for_releases(sigmas: list[float], scales: list[float], delta: float) -> float:
    """The paper's epsilon generalised to heterogeneous releases.

    The printed formula is the classical Gaussian mechanism bound ``eps = Delta_eff sqrt(2 ln(1.25/
    delta)) / sigma`` with ``Delta_eff = 4 sqrt(T-1)``, i.e. per-round sensitivity 4 composed in L2.
    For releases with noise ``sigma_i`` and sensitivity scale ``c_i`` (records per unit) this reads
    ``eps = 4 sqrt(2 ln(1.25/delta)) sqrt(sum_i (c_i/sigma_i)^2)``, which is exactly the printed
    formula when all sigmas are equal and ``c_i = 1``.
    """
    delta = check_delta(delta)
    if not sigmas:
        return 0.0
    total = math.fsum((c / s) ** 2 for s, c in zip(sigmas, scales, strict=True))
    return PAPER_CONSTANT * math.sqrt(2.0 * math.log(1.25 / delta)) * math.sqrt(total)


# --------------------------------------------------------------------------------------------
# the ledger
# --------------------------------------------------------------------------------------------


@dataclass
class PrivacyLedger:
    """Running record of the releases of a run, refusing any release that would exceed the budget.

    Every release is checked with the exact accountant; the ledger's own accountant (the one that
    chose sigma) must also stay within the budget.  Both accountants are always reported.  A run's
    ledger also holds the releases its plan made (``planned``) and refuses any other, and any of
    them a second time: the plan decides what is released, the ledger enforces it.
    """

    epsilon: float
    delta: float
    accountant: Accountant = field(default_factory=ExactAccountant)
    releases: list[GaussianRelease] = field(default_factory=list)
    #: The releases the plan pays for (None: any release within the budget, e.g. Hot PATE's steps).
    planned: tuple[GaussianRelease, ...] | None = None

    def __post_init__(self) -> None:
        self.epsilon = check_positive("epsilon", self.epsilon)
        self.delta = check_delta(self.delta)
        if not isinstance(self.accountant, Accountant):
            self.accountant = get_accountant(self.accountant)

    def spent_epsilon(self) -> float:
        """Epsilon spent so far: always the exact composition of the Gaussian releases (the guarantee)."""
        return EXACT.epsilon(self.releases, self.delta)

    def spent_epsilon_exact(self) -> float:
        return EXACT.epsilon(self.releases, self.delta)

    def spent_epsilon_paper(self) -> float:
        return ACCOUNTANTS[AccountantMode.PAPER].epsilon(self.releases, self.delta)

    def record(self, release: GaussianRelease) -> GaussianRelease:
        """Append one release; raises :class:`PrivacyBudgetExceeded` *before* appending if it would
        push the spent epsilon (exact, and the ledger's own accountant's) over the budget by more
        than ``BUDGET_RTOL``; :class:`UnplannedRelease` for a release the plan did not make."""
        if self.planned is not None and (release not in self.planned or release in self.releases):
            raise UnplannedRelease(
                f"release of {release.what} after round {release.round} (sigma {release.sigma:.6g}) is "
                + ("already recorded" if release in self.releases else "not in the run's privacy plan")
            )
        after = EXACT.epsilon([*self.releases, release], self.delta)
        claimed = self.accountant.epsilon([*self.releases, release], self.delta)
        if max(after, claimed) > self.epsilon * (1.0 + BUDGET_RTOL):
            raise PrivacyBudgetExceeded(
                f"release for round {release.round} would spend epsilon={after:.6g} "
                f"(exact accountant; {claimed:.6g} by the {self.accountant.mode.value} formula) over the "
                f"budget epsilon={self.epsilon:.6g}"
            )
        self.releases.append(release)
        logger.debug(
            "privacy ledger: round %d recorded, spent epsilon %.6g of %.6g",
            release.round,
            after,
            self.epsilon,
        )
        return release

    def to_dict(self) -> dict[str, Any]:
        planned = {} if self.planned is None else {"planned": [asdict(r) for r in self.planned]}
        return {
            "epsilon": self.epsilon,
            "delta": self.delta,
            "mode": self.accountant.mode.value,
            "releases": [asdict(r) for r in self.releases],
        } | planned

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PrivacyLedger:
        releases = [GaussianRelease(**r) for r in data.get("releases", [])]
        planned = data.get("planned")
        return cls(
            data["epsilon"], data["delta"], get_accountant(data.get("mode", "exact")), releases,
            None if planned is None else tuple(GaussianRelease(**r) for r in planned),
        )  # fmt: skip
