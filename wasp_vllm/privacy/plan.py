"""The privacy plan of a run: the noise scales, fixed before any private data is touched."""

from __future__ import annotations

import logging
import math
from dataclasses import asdict, dataclass
from typing import Any

from wasp_vllm.privacy.accountant import (
    ACCOUNTANTS,
    BUDGET_RTOL,
    EXACT,
    Accountant,
    AccountantMode,
    GaussianRelease,
    Neighbour,
    PrivacyBudgetExceeded,
    PrivacyLedger,
    PrivacyUnit,
    get_accountant,
    neighbour_of,
    wasp_sensitivity,
)
from wasp_vllm.privacy.gaussian import check_delta, check_int, check_positive, epsilon_for_mu, mu_for_epsilon

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class PrivacyPlan:
    """Noise scale and bookkeeping for a whole run, fixed before any private data is touched.

    ``compositions = rounds - 1`` (the last round is never voted on) unless a round policy votes
    after fewer rounds.  With ``rounds == 1`` there is no voting at all: ``sigma`` is ``None`` and
    both epsilons are 0.0 - no noise is needed because nothing private is released.
    """

    epsilon: float
    delta: float
    rounds: int
    q: int
    mode: str
    neighbour: str
    records_per_unit: int
    sensitivity: float
    #: Vote histograms each voting round releases: 2 (``H_near`` and ``H_far``) or 1 (``H_near``).
    histograms: int
    compositions: int
    sigma: float | None
    epsilon_exact_spent: float
    epsilon_paper_claimed: float
    #: Noise and sensitivity of the noisy histogram of private labels (``label_prior="private"``).
    prior_sigma: float | None = None
    prior_sensitivity: float | None = None

    @property
    def needs_noise(self) -> bool:
        """True when at least one release touches private information."""
        return self.compositions > 0 or self.prior_sigma is not None

    def open_ledger(self) -> PrivacyLedger:
        """An empty ledger for this plan's budget and accountant (the budget is kept in the plan
        alone; the ledger charges every release against it)."""
        return PrivacyLedger(self.epsilon, self.delta, get_accountant(self.mode))

    def release(self, round_index: int) -> GaussianRelease:
        """The release this plan makes in one voting round."""
        if self.sigma is None:
            raise ValueError("a plan without voting rounds makes no release")
        return GaussianRelease(
            round_index, self.sigma, self.sensitivity, self.neighbour, self.records_per_unit
        )

    def prior_release(self) -> GaussianRelease:
        """The release of the noisy label histogram."""
        if self.prior_sigma is None or self.prior_sensitivity is None:
            raise ValueError("this plan releases no label histogram")
        return GaussianRelease(0, self.prior_sigma, self.prior_sensitivity, self.neighbour, 1, "label-prior")

    def to_dict(self) -> dict[str, Any]:
        plan = asdict(self)
        return {k: v for k, v in plan.items() if not (k.startswith("prior_") and v is None)}


def released_histograms(histograms: int) -> str:
    """What each vote of a plan with ``histograms`` releases, as the plan, report and CLI name it."""
    return "H_near, H_far" if histograms == 2 else "H_near"


def plan_privacy(
    epsilon: float,
    delta: float,
    rounds: int,
    q: int,
    mode: AccountantMode | str = AccountantMode.EXACT,
    unit: PrivacyUnit = PrivacyUnit(),
    *,
    prior_share: float = 0.0,
    histograms: int = 2,
    releases: int | None = None,
) -> PrivacyPlan:
    """Choose sigma for a run of ``rounds`` rounds with ``q`` votes per private sample.

    The accountant named by ``mode`` chooses sigma; the exact accountant must agree that it spends
    at most ``epsilon`` (the paper's formula under-noises at large epsilon).  Both epsilons are
    always reported.  ``prior_share`` > 0 also plans a Gaussian histogram of the private labels: that share
    of the budget's ``mu^2`` (Gaussian DP composes as a sum of ``mu^2``) goes to it, the rest to
    the votes (exact accountant only).  ``histograms``: 1 where each vote releases ``H_near`` alone.
    ``releases``: the votes, one after every round but the last unless a round policy votes less.
    """
    epsilon, delta = check_positive("epsilon", epsilon), check_delta(delta)
    rounds = check_int("rounds", rounds, 1)
    accountant, neighbour, per_unit = (
        get_accountant(mode),
        neighbour_of(unit.neighbour),
        unit.records_per_unit,
    )
    sensitivity = wasp_sensitivity(q, neighbour, per_unit, histograms)
    fixed = (epsilon, delta, rounds, q, accountant.mode.value, neighbour.value, per_unit, sensitivity,
             histograms)  # fmt: skip
    compositions = _compositions(rounds, releases)
    prior = _prior(epsilon, delta, neighbour, per_unit, prior_share, accountant)
    if compositions == 0 and prior is None:
        logger.debug("no vote: no noise needed, no privacy spent")
        return PrivacyPlan(*fixed, 0, None, 0.0, 0.0)
    votes_epsilon = epsilon if prior is None else prior[2]
    sigma = (
        accountant.sigma(votes_epsilon, delta, sensitivity, compositions, per_unit) if compositions else None
    )
    planned = [
        GaussianRelease(t, sigma, sensitivity, neighbour.value, per_unit)
        for t in range(compositions)
        if sigma is not None
    ]
    priors = (
        [] if prior is None else [GaussianRelease(0, prior[0], prior[1], neighbour.value, 1, "label-prior")]
    )
    eps_exact = EXACT.epsilon([*planned, *priors], delta)
    if eps_exact > epsilon * (1.0 + BUDGET_RTOL):
        raise PrivacyBudgetExceeded(
            _overspend_message(accountant, epsilon, eps_exact, sigma, planned, priors, delta)
        )
    eps_paper = ACCOUNTANTS[AccountantMode.PAPER].epsilon(planned, delta)
    logger.debug(
        "privacy plan: mode=%s sigma=%s compositions=%d exact eps=%.6g paper eps=%.6g",
        accountant.mode.value, sigma and f"{sigma:.6g}", compositions, eps_exact, eps_paper,
    )  # fmt: skip
    prior_fields = (None, None) if prior is None else prior[:2]
    return PrivacyPlan(*fixed, compositions, sigma, eps_exact, eps_paper, *prior_fields)


def _compositions(rounds: int, releases: int | None) -> int:
    """The votes of a run: one after every round but the last unless ``releases`` says fewer."""
    if releases is None:
        return rounds - 1
    if check_int("releases", releases, 0) > rounds - 1:
        raise ValueError(f"{releases} votes in {rounds} rounds: the last round is never voted on")
    return releases


def _prior(
    epsilon: float, delta: float, neighbour: Neighbour, unit: int, share: float, accountant: Accountant
) -> tuple[float, float, float] | None:
    """(sigma, sensitivity) of the label histogram and the epsilon left for the votes, or None.

    One record moves one label count by 1 (one unit: by its record cap; replace: two counts).
    """
    if share <= 0:
        return None
    if accountant.mode is not AccountantMode.EXACT or not 0 < share < 1:
        raise ValueError("a label prior needs the exact accountant and a share in (0, 1)")
    mu = mu_for_epsilon(epsilon, delta)
    sensitivity = unit * (math.sqrt(2.0) if neighbour is Neighbour.REPLACE else 1.0)
    sigma = math.nextafter(sensitivity / (math.sqrt(share) * mu), math.inf)
    return sigma, sensitivity, epsilon_for_mu(math.sqrt(1.0 - share) * mu, delta)


def _overspend_message(
    accountant: Accountant,
    epsilon: float,
    spent: float,
    sigma: float | None,
    votes: list[GaussianRelease],
    priors: list[GaussianRelease],
    delta: float,
) -> str:
    """Why a plan spends more than its budget, naming the cause: the paper's formula, or the split."""
    if accountant.mode is AccountantMode.PAPER:
        return (
            f"the paper's formula under-noises at epsilon={epsilon:g}: its sigma={sigma:.4g} spends "
            f"epsilon={spent:.4g} by the exact accountant (the formula is proven for epsilon < 1 only); "
            "use --accountant exact"
        )
    parts = [f"the votes ({len(votes)} releases) {EXACT.epsilon(votes, delta):.4g}" if votes else ""]
    parts += [f"the label prior {EXACT.epsilon(priors, delta):.4g}" if priors else ""]
    return (
        f"the planned releases spend epsilon={spent:.4g} together, over the budget epsilon={epsilon:g} "
        f"({'; '.join(p for p in parts if p)} on their own): lower --label-prior-share or raise --epsilon"
    )
