"""The privacy plan of a run: the noise scales, fixed before any private data is touched."""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
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

#: What the releases beside the votes are called (``GaussianRelease.what``).
LABEL_PRIOR, UTILITY_CHECK = "label-prior", "utility-check"
#: The utility check's confusion matrices (the synthetic set's task model, the zero-shot
#: reference's, the nearest label description), each holding one count per private record.
UTILITY_MATRICES = 3


@dataclass(frozen=True)
class PrivacyPlan:
    """Noise scale and bookkeeping for a whole run, fixed before any private data is touched.

    The plan owns the vote schedule: the records vote after the rounds in ``vote_rounds`` (every
    round but the last, which is never voted on, unless fewer were asked for: :class:`VoteShape`),
    ``compositions`` of them.  With ``rounds == 1`` there is no voting at all: ``sigma`` is ``None``
    and both epsilons are 0.0 - no noise is needed because nothing private is released.  The
    ledger it opens refuses any release it did not plan.
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
    #: The rounds after which the records vote, ascending (``compositions`` of them).
    vote_rounds: tuple[int, ...] = ()
    #: Noise and sensitivity of the utility check's confusion matrices (after the last round).
    utility_sigma: float | None = None
    utility_sensitivity: float | None = None

    @property
    def needs_noise(self) -> bool:
        """True when at least one release touches private information."""
        return self.compositions > 0 or self.prior_sigma is not None

    @property
    def steers_first_round(self) -> bool:
        """Whether a release comes before round 0's prompts are written (the label histogram sets
        round 0's label mix): round 0 is then not public work."""
        return self.prior_sigma is not None

    def votes_after(self, round_index: int) -> bool:
        """Whether the records vote on the samples so far after round ``round_index``."""
        return round_index in self.vote_rounds

    def planned_releases(self) -> tuple[GaussianRelease, ...]:
        """Every release this plan pays for: the label histogram, one per vote, the utility check."""
        prior = (self.prior_release(),) if self.prior_sigma is not None else ()
        check = (self.utility_release(),) if self.utility_sigma is not None else ()
        return prior + tuple(self.release(t) for t in self.vote_rounds) + check

    def open_ledger(self) -> PrivacyLedger:
        """An empty ledger for this plan's budget and accountant, which refuses any release the
        plan did not make (the budget and the schedule are kept in the plan alone)."""
        return PrivacyLedger(
            self.epsilon, self.delta, get_accountant(self.mode), planned=self.planned_releases()
        )

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
        return GaussianRelease(0, self.prior_sigma, self.prior_sensitivity, self.neighbour, 1, LABEL_PRIOR)

    def utility_release(self) -> GaussianRelease:
        """The release of the utility check's noisy confusion matrices, after the last round."""
        if self.utility_sigma is None or self.utility_sensitivity is None:
            raise ValueError("this plan makes no utility check")
        return GaussianRelease(
            self.rounds - 1, self.utility_sigma, self.utility_sensitivity, self.neighbour, 1, UTILITY_CHECK
        )

    def to_dict(self) -> dict[str, Any]:
        plan = asdict(self) | {"vote_rounds": list(self.vote_rounds)}
        return {k: v for k, v in plan.items() if not (k.startswith(("prior_", "utility_")) and v is None)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PrivacyPlan:
        """A plan as :meth:`to_dict` wrote it (a run from before the schedule was kept voted after
        every round it counted; one from before ``histograms`` released both)."""
        known = {f.name for f in fields(cls)}
        values = {"histograms": 2} | {k: v for k, v in data.items() if k in known}
        values["vote_rounds"] = tuple(values.get("vote_rounds", range(int(data["compositions"]))))
        return cls(**values)


@dataclass(frozen=True)
class VoteShape:
    """What each vote releases and when, as a run asks for it (the plan decides).

    ``histograms``: 2 where each vote releases ``H_near`` and ``H_far``, 1 for ``H_near`` alone.
    ``after``: the rounds after which the records vote; None for the paper's schedule, after every
    round but the last.  A round policy may ask for fewer votes (each then gets less noise).
    """

    histograms: int = 2
    after: tuple[int, ...] | None = None

    def schedule(self, rounds: int) -> tuple[int, ...]:
        """The rounds after which the records vote in a run of ``rounds`` rounds (ascending)."""
        if self.after is None:
            return tuple(range(rounds - 1))
        asked = sorted(set(self.after))
        if any(isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < rounds - 1 for t in asked):
            raise ValueError(
                f"votes after rounds {list(self.after)} in {rounds} rounds: each must be a round in "
                f"0..{rounds - 2} (the last round is never voted on)"
            )
        return tuple(asked)


def released_histograms(histograms: int) -> str:
    """What each vote of a plan with ``histograms`` releases, as the plan, report and CLI name it."""
    return "H_near, H_far" if histograms == 2 else "H_near"


@dataclass(frozen=True)
class BudgetShares:
    """Shares of the budget spent on releases other than the votes, in Gaussian DP's ``mu^2`` (a
    composition's ``mu^2`` is the sum of its parts'): the noisy histogram of the private labels
    (``label_prior``) and the utility check's noisy confusion matrices (``utility_check``).  The
    votes get the rest.  Exact accountant only."""

    label_prior: float = 0.0
    utility_check: float = 0.0

    def __post_init__(self) -> None:
        for name, share in (("label prior", self.label_prior), ("utility check", self.utility_check)):
            if not 0 <= share < 1:
                raise ValueError(f"the {name}'s share of the budget must be in [0, 1), got {share!r}")
        if self.label_prior + self.utility_check >= 1:
            raise ValueError("the label prior's and the utility check's shares leave nothing for the votes")

    @property
    def votes(self) -> float:
        return 1.0 - self.label_prior - self.utility_check


def plan_privacy(
    epsilon: float,
    delta: float,
    rounds: int,
    q: int,
    mode: AccountantMode | str = AccountantMode.EXACT,
    unit: PrivacyUnit = PrivacyUnit(),
    *,
    shares: BudgetShares = BudgetShares(),
    votes: VoteShape = VoteShape(),
) -> PrivacyPlan:
    """Choose sigma for a run of ``rounds`` rounds with ``q`` votes per private sample.

    The accountant named by ``mode`` chooses sigma; the exact accountant must agree that it spends
    at most ``epsilon`` (the paper's formula under-noises at large epsilon).  Both epsilons are
    always reported.  ``shares`` plans releases beside the votes (the label histogram, the utility
    check) with their shares of the budget's ``mu^2``, the rest going to the votes.  ``votes``: what
    each vote releases and after which rounds (by default both histograms, after every round but
    the last).
    """
    epsilon, delta = check_positive("epsilon", epsilon), check_delta(delta)
    rounds = check_int("rounds", rounds, 1)
    accountant, neighbour, per_unit = (
        get_accountant(mode),
        neighbour_of(unit.neighbour),
        unit.records_per_unit,
    )
    sensitivity = wasp_sensitivity(q, neighbour, per_unit, votes.histograms)
    fixed = (epsilon, delta, rounds, q, accountant.mode.value, neighbour.value, per_unit, sensitivity,
             votes.histograms)  # fmt: skip
    schedule = votes.schedule(rounds)
    compositions = len(schedule)
    side = _side_releases(epsilon, delta, PrivacyUnit(neighbour, per_unit), shares, accountant)
    if compositions == 0 and not side.any:
        logger.debug("no vote: no noise needed, no privacy spent")
        return PrivacyPlan(*fixed, 0, None, 0.0, 0.0)
    sigma = (
        accountant.sigma(side.votes_epsilon, delta, sensitivity, compositions, per_unit)
        if compositions
        else None
    )
    planned = [GaussianRelease(t, sigma, sensitivity, neighbour.value, per_unit) for t in schedule if sigma]
    others = side.releases(rounds, neighbour.value)
    eps_exact = EXACT.epsilon([*planned, *others], delta)
    if eps_exact > epsilon * (1.0 + BUDGET_RTOL):
        raise PrivacyBudgetExceeded(
            _overspend_message(accountant, epsilon, eps_exact, sigma, planned, others, delta)
        )
    eps_paper = ACCOUNTANTS[AccountantMode.PAPER].epsilon(planned, delta)
    logger.debug(
        "privacy plan: mode=%s sigma=%s compositions=%d exact eps=%.6g paper eps=%.6g",
        accountant.mode.value, sigma and f"{sigma:.6g}", compositions, eps_exact, eps_paper,
    )  # fmt: skip
    return PrivacyPlan(
        *fixed, compositions, sigma, eps_exact, eps_paper, *side.prior, schedule, *side.utility
    )


@dataclass(frozen=True)
class _SideReleases:
    """The releases beside the votes: (sigma, sensitivity) of each that is planned, and the epsilon
    left for the votes."""

    prior: tuple[float | None, float | None]
    utility: tuple[float | None, float | None]
    votes_epsilon: float

    @property
    def any(self) -> bool:
        return self.prior[0] is not None or self.utility[0] is not None

    def releases(self, rounds: int, neighbour: str) -> list[GaussianRelease]:
        """The label histogram (before round 0) and the utility check (after the last round)."""
        planned = []
        for (sigma, sensitivity), when, what in ((self.prior, 0, LABEL_PRIOR), (self.utility, rounds - 1,
                                                                                 UTILITY_CHECK)):  # fmt: skip
            if sigma is not None and sensitivity is not None:
                planned.append(GaussianRelease(when, sigma, sensitivity, neighbour, 1, what))
        return planned


def _side_releases(
    epsilon: float, delta: float, unit: PrivacyUnit, shares: BudgetShares, accountant: Accountant
) -> _SideReleases:
    """Each side release gets ``sigma = sensitivity / (sqrt(share) mu)``, the votes what is left.

    Sensitivities (one unit of at most ``k`` records; replace: ``sqrt 2`` times add/remove):
    the label histogram: one record moves one count by 1, ``k``; the utility check: one record puts
    one count in each of its ``UTILITY_MATRICES`` confusion matrices, ``k sqrt 3``.
    """
    if shares == BudgetShares():
        return _SideReleases((None, None), (None, None), epsilon)
    if accountant.mode is not AccountantMode.EXACT:
        raise ValueError("a label prior or a utility check needs the exact accountant")
    mu = mu_for_epsilon(epsilon, delta)
    scale = unit.records_per_unit * (math.sqrt(2.0) if unit.neighbour is Neighbour.REPLACE else 1.0)

    def side(share: float, sensitivity: float) -> tuple[float | None, float | None]:
        if share <= 0:
            return None, None
        return math.nextafter(sensitivity / (math.sqrt(share) * mu), math.inf), sensitivity

    prior = side(shares.label_prior, scale)
    utility = side(shares.utility_check, scale * math.sqrt(UTILITY_MATRICES))
    return _SideReleases(prior, utility, epsilon_for_mu(math.sqrt(shares.votes) * mu, delta))


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
    parts += [f"the {r.what.replace('-', ' ')} {EXACT.epsilon([r], delta):.4g}" for r in priors]
    return (
        f"the planned releases spend epsilon={spent:.4g} together, over the budget epsilon={epsilon:g} "
        f"({'; '.join(p for p in parts if p)} on their own): lower their shares or raise --epsilon"
    )
