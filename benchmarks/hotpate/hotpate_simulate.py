"""Replay measured token positions under each accounting: private tokens a budget buys.

Input: the walks of :mod:`hotpate_measure` (per label, per token position, the top vote count of
several coordinated draws as a fraction of ``n``).  A simulated run of ``records`` records writes,
label by label, records whose lengths cycle through the measured ones, over the label's measured
positions in order.  Every token decision follows the generator's selector: up to ``1 + retries``
calls, each on a fresh draw (one of the measured draws of that position, at random), then the
fallback; the accountants are the real ones (``wasp_vllm.hotpate.steps``), only the decision of a
call is computed from the top count alone:

* Gaussian ledger: a call yields iff ``c + N(0, sigma^2) >= T`` (``T = f n``).  The real release
  noises every bin, so a token nobody voted for clears ``T`` with probability ``<= beta = 1e-3``
  (ignored), and the runner-up has ``<= n - c < T - L`` votes;
* target charging: the exact law of :class:`BoundaryNoisyArgMax` (``outcome_probabilities``);
* the old generator (before issue 17): one ledger over all labels, sigma calibrated for one release
  per planned token (``records * max_tokens``), the run stops (dropping the open record) when the
  ledger refuses.

Teachers beyond the measured ``n`` (``n' > n``) are extrapolated by keeping each draw's top-count
*fraction*: with coordinated ensembles and teachers drawn i.i.d. from the data, ``c_max / n``
concentrates on the population's agreement as ``n`` grows, so the measured fractions (with their
``n = 67`` sampling noise) stand in for any ``n'``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.stats import norm

from wasp_vllm.hotpate.accounting import StepOutcome
from wasp_vllm.hotpate.steps import (
    ChargedStep,
    charged_step,
    gaussian_release_cap,
    gaussian_sigma,
    label_budget,
    vote_sensitivity,
)
from wasp_vllm.privacy.gaussian import calibrate_sigma

VOCAB = 49152  # SmolLM2
BETA = 1e-3
UNREACHABLE_P = 1e-9


@dataclass(frozen=True)
class Scenario:
    """One simulated run: accounting, budget, teachers per label and the public knobs."""

    accounting: str  # "gaussian", "target-charging" or "old-gaussian"
    epsilon: float
    n_teachers: int
    fraction: float = 0.9
    records: int = 50
    max_tokens: int = 48
    delta: float = 1e-5
    neighbour: str = "replace"
    retries: int = 2


@dataclass
class Outcome:
    private: int = 0
    fallback: int = 0
    calls: int = 0
    records_written: int = 0
    stopped: bool = False

    @property
    def share(self) -> float:
        total = self.private + self.fallback
        return self.private / total if total else 0.0


class _Caller:
    """One label's accountant and decision rule (the real accountants; decisions from ``c``)."""

    def __init__(self, sc: Scenario, quota: int, shared: dict[str, Any]) -> None:
        self.sc, self.n, self.calls = sc, sc.n_teachers, 0
        budget = label_budget("target-charging" if sc.accounting == "target-charging" else "gaussian",
                              sc.neighbour, sc.epsilon, sc.delta)  # fmt: skip
        self.step: ChargedStep | None = None
        if sc.accounting == "target-charging":
            max_calls = quota * sc.max_tokens * (1 + sc.retries)
            self.step = charged_step(self.n, budget, max_calls, sc.fraction)
            self.silent = self.step.unreachable(self.n, VOCAB)
            return
        if sc.accounting == "old-gaussian":
            if "old" not in shared:  # one ledger for the whole run
                sigma = calibrate_sigma(sc.epsilon, sc.delta, vote_sensitivity(sc.neighbour),
                                        sc.records * sc.max_tokens)  # fmt: skip
                shared["old"] = {"sigma": sigma, "left": sc.records * sc.max_tokens}
            self.sigma = shared["old"]["sigma"]
            self.threshold = self.n / 2 + self.sigma * float(norm.isf(BETA / VOCAB))
            self.left = shared["old"]
        else:
            self.sigma = gaussian_sigma(self.n, VOCAB, sc.fraction, BETA)
            self.threshold = sc.fraction * self.n
            cap = gaussian_release_cap(self.sigma, budget.sensitivity, budget.epsilon, budget.delta)
            self.left = {"left": cap}
        self.silent = bool(norm.sf((self.threshold - self.n) / self.sigma) < UNREACHABLE_P)

    def reserve(self) -> bool:
        if self.step is not None:
            assert self.step.accountant is not None
            return self.step.accountant.can_call()
        if self.left["left"] <= 0:
            return False
        self.left["left"] -= 1
        return True

    def call(self, frac: float, rng: np.random.Generator) -> bool:
        """One call on a histogram whose top count is ``frac * n``; True when it yields a token."""
        self.calls += 1
        c = max(1, min(self.n, int(round(frac * self.n))))
        if self.step is None:
            return bool(c + rng.normal(0.0, self.sigma) >= self.threshold)
        counts = np.concatenate(([c], np.ones(self.n - c, dtype=np.int64)))  # c, then singletons
        law = self.step.mechanism.outcome_probabilities(np.arange(counts.size), counts, self.n)
        u = rng.random()
        token, charged = u < law["p_token"], law["p_token"] <= u < law["p_token"] + law["p_charge"]
        if self.step.mechanism.wrapper == "not_prior":
            charged = token
        assert self.step.accountant is not None
        self.step.accountant.record(StepOutcome(0 if token else None, bool(charged)))
        return bool(token)


def _decide(caller: _Caller, draws: list[float], retries: int, rng: np.random.Generator) -> str:
    """``private``, ``fallback`` or ``budget`` for one token position."""
    if caller.silent:
        return "fallback"
    for _ in range(1 + retries):
        if not caller.reserve():
            return "budget"
        if caller.call(draws[int(rng.integers(len(draws)))], rng):
            return "private"
    return "fallback"


def simulate(walks: list[dict[str, Any]], sc: Scenario, seed: int = 0) -> Outcome:
    """One simulated run of ``sc`` over the measured walks (one per label, in label order)."""
    rng, out = np.random.default_rng(seed), Outcome()
    shared: dict[str, Any] = {}
    quotas = [sc.records // len(walks) + (1 if i < sc.records % len(walks) else 0) for i in range(len(walks))]
    for walk, quota in zip(walks, quotas, strict=True):
        caller, positions, pos = _Caller(sc, quota, shared), walk["fractions"], 0
        lengths = [min(x, sc.max_tokens) for x in walk["record_lengths"]]
        for r in range(quota):
            got = {"private": 0, "fallback": 0}
            for _ in range(lengths[r % len(lengths)]):
                decision = _decide(caller, positions[pos % len(positions)], sc.retries, rng)
                pos += 1
                if decision == "budget" and sc.accounting == "old-gaussian":
                    out.stopped = True  # the old generator dropped the open record and stopped
                    out.calls += caller.calls
                    return out
                got["private" if decision == "private" else "fallback"] += 1
            out.private, out.fallback = out.private + got["private"], out.fallback + got["fallback"]
            out.records_written += 1
        out.calls += caller.calls
    return out


def mean_outcome(walks: list[dict[str, Any]], sc: Scenario, seeds: int = 3) -> dict[str, float]:
    """Averages over ``seeds`` simulated runs."""
    runs = [simulate(walks, sc, seed) for seed in range(seeds)]
    return {
        "private": float(np.mean([r.private for r in runs])),
        "tokens": float(np.mean([r.private + r.fallback for r in runs])),
        "share": float(np.mean([r.share for r in runs])),
        "records_written": float(np.mean([r.records_written for r in runs])),
        "calls": float(np.mean([r.calls for r in runs])),
    }


def teachers_needed(
    walks: list[dict[str, Any]], sc: Scenario, grid: list[int], share: float = 0.5
) -> int | None:
    """Smallest ``n`` per label in ``grid`` whose simulated private share reaches ``share``."""
    for n in grid:
        if mean_outcome(walks, Scenario(**{**sc.__dict__, "n_teachers": n}), seeds=2)["share"] >= share:
            return n
    return None


def grid_up_to(limit: int) -> list[int]:
    """Teachers per label: 50, 67, 100, 125, 175, 225, ... up to ``limit`` (about x1.25 per step)."""
    out, n = [50, 67], 100
    while n <= limit:
        out.append(n)
        n = int(math.ceil(n * 1.25 / 25.0) * 25)
    return out
