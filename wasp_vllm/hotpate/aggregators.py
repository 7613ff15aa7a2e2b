"""Private aggregation of a vote histogram: a Gaussian release, then post-processing.

Every aggregator here does the same private step - add ``N(0, sigma^2)`` to *every* bin of
the dense histogram (the whole vocabulary, including the tokens nobody voted for) - and then
decides from the noisy counts alone.  So each call is exactly one Gaussian mechanism with
L2 sensitivity ``sqrt(2)`` (one teacher's change moves one vote), whatever the decision rule,
and the accountant composes the calls exactly.  Noising only the non-zero bins would be
cheaper but would leak *which* tokens got votes and need an extra delta; a 50k-262k vector of
normals costs well under 10 ms, so we do not bother.

The decision rules follow Hot PATE:

* :class:`HomogeneousAggregator` (teachers that mostly agree): noisy argmax, returned only
  when its noisy count clears ``threshold``; by default ``n/2 + L``: a majority of the
  teachers (so at most one token can qualify) plus the noise margin ``L``.
* :class:`HeterogeneousAggregator` (teachers that only partly agree): weighted sampling -
  token ``j`` with probability ``noisy_j / n`` among the tokens whose noisy count clears
  ``threshold`` (default ``2L``), "nothing" with the remaining probability.  Over the shared
  randomness of a coordinated ensemble this returns a token with probability close to the
  teachers' average probability of it whenever enough teachers support it: diversity is
  transferred, not flattened to the mode.

``L`` (:func:`noise_margin`) is the count that a token with *no* votes exceeds with
probability at most ``beta`` after noise, union-bounded over the vocabulary: a threshold of
at least ``L`` keeps tokens nobody proposed out of the output.  When nothing clears the
threshold the aggregator returns ``None`` and the caller may retry with fresh shared
randomness (a new release) or fall back to a public prompt.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy.special import ndtri

from wasp_vllm.hotpate.ensembles import VoteHistogram

#: L2 sensitivity of one teacher's vote: one bin down by one, another up by one.
VOTE_SENSITIVITY = math.sqrt(2.0)
#: Default probability that any zero-vote token clears the margin ``L`` in one release.
DEFAULT_BETA = 1e-3


def noise_margin(sigma: float, vocab_size: int, beta: float = DEFAULT_BETA) -> float:
    """``L = sigma * z`` with ``P(max of vocab_size N(0, sigma^2) > L) <= beta`` (union bound)."""
    if sigma < 0 or vocab_size < 1 or not 0.0 < beta < 1.0:
        raise ValueError("noise_margin needs sigma >= 0, vocab_size >= 1 and 0 < beta < 1")
    # -ndtri(q) is scipy.stats.norm.isf(q) to the bit, without its ~100 us of argument checks: this
    # runs once per token release.
    return float(sigma * -ndtri(beta / vocab_size))


@dataclass(frozen=True)
class AggregationResult:
    """What one release decided: a token id or ``None`` (nothing cleared the threshold).

    ``noisy_count`` is the noisy count of the returned token (a DP output; never the true
    count); ``threshold`` the absolute count that was required.
    """

    token: int | None
    noisy_count: float | None
    threshold: float


def noisy_histogram(hist: VoteHistogram, sigma: float, rng: np.random.Generator) -> np.ndarray:
    """The Gaussian release: the dense histogram plus ``N(0, sigma^2)`` in every bin."""
    if sigma < 0:
        raise ValueError("sigma must be >= 0")
    noisy = hist.dense()
    if sigma > 0:
        noisy += rng.normal(0.0, sigma, size=noisy.size)
    return noisy


class Aggregator:
    """Shared configuration: noise scale, an optional absolute threshold, the margin's beta."""

    name = "base"

    def __init__(self, sigma: float, threshold: float | None = None, beta: float = DEFAULT_BETA) -> None:
        if sigma < 0:
            raise ValueError("sigma must be >= 0")
        self.sigma = float(sigma)
        self.threshold = None if threshold is None else float(threshold)
        self.beta = float(beta)

    def margin(self, vocab_size: int) -> float:
        """The noise margin ``L`` for this noise scale and vocabulary."""
        return noise_margin(self.sigma, vocab_size, self.beta)

    def default_threshold(self, n_teachers: int, vocab_size: int) -> float:
        raise NotImplementedError

    def resolve_threshold(self, n_teachers: int, vocab_size: int) -> float:
        """The absolute count a token's noisy count must reach (explicit or default)."""
        if self.threshold is not None:
            return self.threshold
        return self.default_threshold(n_teachers, vocab_size)

    def __call__(
        self, hist: VoteHistogram, rng: np.random.Generator, noise_rng: np.random.Generator | None = None
    ) -> AggregationResult:
        """One release: noise from ``noise_rng`` (a secret stream in a real run; ``rng`` if None),
        post-processing draws from ``rng``."""
        raise NotImplementedError


class HomogeneousAggregator(Aggregator):
    """Noisy argmax with a threshold (default ``n/2 + L``)."""

    name = "homogeneous"

    def default_threshold(self, n_teachers: int, vocab_size: int) -> float:
        return n_teachers / 2.0 + self.margin(vocab_size)

    def __call__(
        self, hist: VoteHistogram, rng: np.random.Generator, noise_rng: np.random.Generator | None = None
    ) -> AggregationResult:
        threshold = self.resolve_threshold(hist.n_teachers, hist.vocab_size)
        noisy = noisy_histogram(hist, self.sigma, noise_rng or rng)
        best = int(noisy.argmax())
        if noisy[best] >= threshold:
            return AggregationResult(best, float(noisy[best]), threshold)
        return AggregationResult(None, None, threshold)


class HeterogeneousAggregator(Aggregator):
    """Weighted sampling among the tokens whose noisy count clears the threshold (default ``2L``).

    With ``renormalize=False`` (the paper's rule) the mass of the tokens below the threshold
    becomes "nothing" (token ``j`` w.p. ``noisy_j / n``); with ``renormalize=True`` one of the
    qualifying tokens is always returned when there is one - fewer retries (so less privacy
    spent per token), at the price of over-weighting tokens that win alone.
    """

    name = "heterogeneous"

    def __init__(
        self,
        sigma: float,
        threshold: float | None = None,
        beta: float = DEFAULT_BETA,
        renormalize: bool = False,
    ) -> None:
        super().__init__(sigma, threshold, beta)
        self.renormalize = renormalize

    def default_threshold(self, n_teachers: int, vocab_size: int) -> float:
        return 2.0 * self.margin(vocab_size)

    def __call__(
        self, hist: VoteHistogram, rng: np.random.Generator, noise_rng: np.random.Generator | None = None
    ) -> AggregationResult:
        threshold = self.resolve_threshold(hist.n_teachers, hist.vocab_size)
        noisy = noisy_histogram(hist, self.sigma, noise_rng or rng)
        # A non-positive threshold would let every bin qualify; weights must be positive.
        candidates = np.flatnonzero((noisy >= threshold) & (noisy > 0))
        if candidates.size == 0:
            return AggregationResult(None, None, threshold)
        weights = noisy[candidates]
        # n is public; noise can push the total above n, then we renormalise to the total.
        total = weights.sum() if self.renormalize else max(float(hist.n_teachers), float(weights.sum()))
        pick = int(np.searchsorted(np.cumsum(weights), rng.uniform(0.0, total), side="right"))
        if pick >= candidates.size:
            return AggregationResult(None, None, threshold)
        token = int(candidates[pick])
        return AggregationResult(token, float(noisy[token]), threshold)


def make_aggregator(
    kind: str,
    sigma: float,
    threshold: float | None = None,
    beta: float = DEFAULT_BETA,
    renormalize: bool = False,
) -> Aggregator:
    """Build an aggregator by name (``homogeneous`` or ``heterogeneous``)."""
    if kind == "homogeneous":
        return HomogeneousAggregator(sigma, threshold, beta)
    if kind == "heterogeneous":
        return HeterogeneousAggregator(sigma, threshold, beta, renormalize)
    raise ValueError(f"aggregator must be 'homogeneous' or 'heterogeneous', got {kind!r}")
