"""What a run publishes about its privacy: one typed value, written and read through this module.

``manifest.json``'s ``privacy`` section is :meth:`PrivacyReport.to_json`; every reader (the run's
summary, the data set's card, the report page, ``publish``, the audit, ``RunResult.privacy`` of
the Python API) reads it back with :meth:`PrivacyReport.from_json`, never by key.  Everything in
it is a public setting or a function of the noisy releases: the plan (made before any private
record is read), the ledger's releases (their noise and sensitivity), and what the guarantee is
about.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

from wasp_vllm.privacy.accountant import PrivacyLedger
from wasp_vllm.privacy.plan import PrivacyPlan
from wasp_vllm.privacy.utility import UtilityFigures


@dataclass(frozen=True)
class LedgerReport:
    """What the ledger recorded: the budget, the spend under both accountants, every release's noise."""

    mode: str
    epsilon_budget: float
    delta: float
    #: The guarantee's epsilon: the exact composition of the releases (equal to ``epsilon_spent_exact``).
    epsilon_spent: float
    epsilon_spent_exact: float
    epsilon_spent_paper: float
    compositions: int
    #: The releases' one sigma, or None when they differ (a label histogram beside the votes).
    sigma: float | None
    sigmas: list[float]
    #: One value when every release shares it, else the distinct values, sorted.
    sensitivity: float | list[float]
    neighbour: str | list[str]
    records_per_unit: int | list[int]
    #: The round after which each release was made, in release order.
    rounds: list[int]

    @classmethod
    def of(cls, ledger: PrivacyLedger) -> LedgerReport:
        sigmas = [r.sigma for r in ledger.releases]
        return cls(
            mode=ledger.accountant.mode.value,
            epsilon_budget=ledger.epsilon,
            delta=ledger.delta,
            epsilon_spent=ledger.spent_epsilon(),
            epsilon_spent_exact=ledger.spent_epsilon_exact(),
            epsilon_spent_paper=ledger.spent_epsilon_paper(),
            compositions=len(ledger.releases),
            sigma=sigmas[0] if len(set(sigmas)) == 1 else None,
            sigmas=sigmas,
            sensitivity=_one_or_all([r.sensitivity for r in ledger.releases]),
            neighbour=_one_or_all([r.neighbour for r in ledger.releases]),
            records_per_unit=_one_or_all([r.records_per_unit for r in ledger.releases]),
            rounds=[r.round for r in ledger.releases],
        )

    @property
    def sensitivities(self) -> tuple[float, ...]:
        """The distinct L2 sensitivities of the releases (empty where there was none)."""
        return _listed(self.sensitivity)

    @property
    def neighbours(self) -> tuple[str, ...]:
        return _listed(self.neighbour)


@dataclass(frozen=True)
class Neighbourhood:
    """What the guarantee is about, in words and numbers (public settings only)."""

    unit: str
    input_file: str
    max_records_per_unit: int
    #: How a user's records are bounded to ``max_records_per_unit`` (None for record-level runs).
    bounding: str | None
    selection: str
    voting_set: str
    why: str


@dataclass(frozen=True)
class PrivacyReport:
    """The ``privacy`` section of a run's manifest."""

    #: The guarantee in one sentence; says VOID when the noise came from a public ``--noise-seed``.
    guarantee: str
    epsilon_void: bool
    plan: PrivacyPlan
    ledger: LedgerReport
    neighbourhood: Neighbourhood
    #: Where the noise came from (a secret key, or a public seed).
    noise: str
    #: The federated aggregation's public parameters, shown as they are (federated runs only).
    federated: Mapping[str, Any] | None = None
    #: What the utility check's noisy confusion matrices say (runs that make it).
    utility_check: UtilityFigures | None = None

    # The figures a reader asks for first (``result.privacy.epsilon_spent`` in a notebook).
    @property
    def epsilon_spent(self) -> float:
        """By the exact accountant (the paper's formula's figure: ``ledger.epsilon_spent_paper``)."""
        return self.ledger.epsilon_spent_exact

    @property
    def epsilon_budget(self) -> float:
        return self.ledger.epsilon_budget

    @property
    def delta(self) -> float:
        return self.ledger.delta

    @property
    def sigma(self) -> float | None:
        """The releases' one noise scale (None where they differ, or where nothing was released)."""
        return self.ledger.sigma

    @property
    def sigmas(self) -> tuple[float, ...]:
        """One per release (label histogram, votes), in release order."""
        return tuple(self.ledger.sigmas)

    @property
    def sensitivities(self) -> tuple[float, ...]:
        return self.ledger.sensitivities

    @property
    def accountant(self) -> str:
        return self.ledger.mode

    @property
    def compositions(self) -> int:
        return self.ledger.compositions

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "guarantee": self.guarantee,
            "epsilon_void": self.epsilon_void,
            "plan": self.plan.to_dict(),
            "ledger": asdict(self.ledger),
            "neighbourhood": asdict(self.neighbourhood),
            "noise": self.noise,
        }
        if self.federated is not None:
            data["federated"] = dict(self.federated)
        if self.utility_check is not None:
            data["utility_check"] = self.utility_check.to_json()
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> PrivacyReport:
        """The section as :meth:`to_json` wrote it (``KeyError``/``TypeError`` where it is not one)."""
        return cls(
            guarantee=str(data["guarantee"]),
            epsilon_void=bool(data["epsilon_void"]),
            plan=PrivacyPlan.from_dict(data["plan"]),
            ledger=_build(LedgerReport, data["ledger"]),
            neighbourhood=_build(Neighbourhood, data["neighbourhood"]),
            noise=str(data["noise"]),
            federated=data.get("federated"),
            utility_check=UtilityFigures.from_json(data["utility_check"])
            if "utility_check" in data
            else None,
        )


def _build(kind: Any, data: Mapping[str, Any]) -> Any:
    """A dataclass from its JSON: every field it declares, nothing else."""
    return kind(**{f.name: data[f.name] for f in fields(kind)})


def _one_or_all(values: list[Any]) -> Any:
    distinct = sorted(set(values))
    return distinct[0] if len(distinct) == 1 else distinct


def _listed(value: Any) -> tuple[Any, ...]:
    return tuple(value) if isinstance(value, list) else (value,)
