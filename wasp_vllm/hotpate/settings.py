"""Every knob of a Hot PATE run (all public), the teachers' sizing and each label's private step.

Sizing.  Each teacher is meant to hold ``k = records_per_teacher`` private records; the number of
teachers per label follows from the *requested* M, a public setting, never from the private label
counts (which would leak): ``n = ceil(M / (k * labels))``.  Records go to teachers by a keyed hash
of their own text, so the real load of a teacher varies (a label with fewer records has some
empty teachers, which get the public prompt); a teacher shows at most ``max_examples_per_teacher``
of its records (default ``2 k``) in hash order.  ``teachers`` overrides the sizing.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from wasp_vllm.hotpate.accounting import WRAPPERS, Wrapper
from wasp_vllm.hotpate.aggregators import make_aggregator
from wasp_vllm.hotpate.ensembles import ENSEMBLE_KINDS, EnsembleKind
from wasp_vllm.hotpate.steps import (
    ACCOUNTINGS,
    Accounting,
    GaussianStep,
    LabelBudget,
    Neighbour,
    PrivateStep,
    charged_step,
    gaussian_sigma,
    label_budget,
)
from wasp_vllm.privacy.accountant import PrivacyLedger
from wasp_vllm.privacy.gaussian import calibrate_sigma


@dataclass(frozen=True)
class HotPateSettings:
    """Every knob of a Hot PATE run (all public; recorded in the report).

    ``threshold_fraction`` sets the noise scale of either accounting (see :mod:`.steps`);
    ``sigma`` or ``planned_releases`` (Gaussian only) override it.  ``max_attempts``: an empty
    record is generated again up to that many times in all.
    """

    n_samples: int
    epsilon: float
    delta: float
    seed: int = 0
    accounting: Accounting = "gaussian"
    requested_m: int | None = None
    records_per_teacher: int = 1
    teachers: int | None = None
    max_tokens: int = 48
    max_examples_per_teacher: int | None = None
    ensemble: EnsembleKind = "coordinated"
    aggregator: str = "homogeneous"
    threshold_fraction: float = 0.9
    threshold: float | None = None
    beta: float = 1e-3
    renormalize: bool = False
    temperature: float = 1.0
    max_retries: int = 2
    sigma: float | None = None
    planned_releases: int | None = None
    gamma: float = 0.5
    wrapper: Wrapper = "boundary"
    stability_share: float = 0.1
    neighbour: Neighbour | str = Neighbour.ADD_REMOVE
    task: str = "text"
    max_example_chars: int = 300
    response_prefix: str = '"'
    stop: tuple[str, ...] = ('"', "\n\n")
    max_attempts: int = 3

    def teachers_per_label(self, n_labels: int) -> int:
        """``teachers`` if set, else ``ceil(requested_m / (records_per_teacher * n_labels))``."""
        if self.teachers is not None:
            return self.teachers
        if self.requested_m is None:
            raise ValueError("Hot PATE sizes its teachers from a public M (--m) or an explicit --teachers")
        return math.ceil(self.requested_m / (self.records_per_teacher * n_labels))

    def examples_shown(self) -> int:
        """At most this many records of a teacher appear in its prompt."""
        return self.max_examples_per_teacher or 2 * self.records_per_teacher

    def quotas(self, n_labels: int) -> list[int]:
        """``n_samples`` split evenly over the labels (the first labels get the remainder)."""
        n = self.n_samples
        return [n // n_labels + (1 if i < n % n_labels else 0) for i in range(n_labels)]

    def max_calls(self, quota: int) -> int:
        """Calls a label of ``quota`` records may make: one per token and retry (public cap)."""
        return max(1, quota * self.max_tokens * (1 + self.max_retries))

    def budget(self) -> LabelBudget:
        """What each label's accountant may spend (see :func:`~wasp_vllm.hotpate.steps.label_budget`)."""
        return label_budget(self.accounting, self.neighbour, self.epsilon, self.delta)

    def gaussian_sigma(self, n_teachers: int, vocab_size: int) -> float:
        """The given sigma; one calibrated for ``planned_releases``; or the threshold-fraction rule."""
        if self.sigma is not None:
            return float(self.sigma)
        budget = self.budget()
        if self.planned_releases is not None:
            return calibrate_sigma(budget.epsilon, budget.delta, budget.sensitivity, self.planned_releases)
        return gaussian_sigma(n_teachers, vocab_size, self.threshold_fraction, self.beta)

    def make_step(self, n_teachers: int, vocab_size: int, quota: int) -> PrivateStep:
        """A fresh private step with its own accountant, for one label's ensemble."""
        budget = self.budget()
        if self.accounting == "target-charging":
            return charged_step(
                n_teachers, budget, self.max_calls(quota), self.threshold_fraction, self.gamma, self.wrapper,
                self.stability_share,
            )  # fmt: skip
        sigma = self.gaussian_sigma(n_teachers, vocab_size)
        aggregator = make_aggregator(self.aggregator, sigma, self.threshold, self.beta, self.renormalize)
        return GaussianStep(aggregator, PrivacyLedger(budget.epsilon, budget.delta), self.neighbour)

    def public(self) -> dict[str, Any]:
        """The settings as published (all of them are public)."""
        return asdict(self)


def check_settings(s: HotPateSettings) -> None:
    """Validate the public settings (no private value is ever echoed)."""
    if s.n_samples < 1 or s.max_tokens < 1 or s.records_per_teacher < 1 or s.max_attempts < 1:
        raise ValueError("n_samples, max_tokens, records_per_teacher and max_attempts must be >= 1")
    if s.teachers is not None and s.teachers < 1:
        raise ValueError("teachers must be >= 1")
    if s.requested_m is not None and s.requested_m < 1:
        raise ValueError("the requested M must be >= 1")
    if s.ensemble not in ENSEMBLE_KINDS:
        raise ValueError(f"ensemble must be one of {ENSEMBLE_KINDS}")
    if s.accounting not in ACCOUNTINGS:
        raise ValueError(f"accounting must be one of {ACCOUNTINGS}")
    if s.wrapper not in WRAPPERS:
        raise ValueError(f"wrapper must be one of {WRAPPERS}")
    if not 0.5 < s.threshold_fraction <= 1.0:
        raise ValueError("threshold_fraction must be in (0.5, 1]")
    if s.accounting == "target-charging":
        if s.aggregator != "homogeneous":
            raise ValueError("target charging is analysed for the homogeneous aggregator only")
        if s.sigma is not None or s.planned_releases is not None or s.threshold is not None:
            raise ValueError("sigma, planned_releases and threshold belong to the Gaussian accounting")


def check_inputs(
    texts: Sequence[str], labels: Sequence[str], label_names: Sequence[str], s: HotPateSettings
) -> None:
    """Validate the inputs without ever echoing a private value."""
    if len(texts) != len(labels):
        raise ValueError(f"{len(texts)} private texts but {len(labels)} labels")
    if not label_names or len(set(label_names)) != len(label_names):
        raise ValueError("label_names must be non-empty and distinct")
    names = set(label_names)
    unknown = sum(1 for lab in labels if lab not in names)
    if unknown:
        raise ValueError(f"{unknown} private labels are not in label_names")
    check_settings(s)
    s.teachers_per_label(len(label_names))
