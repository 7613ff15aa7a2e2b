"""One token at a time from the teachers' distributions: draw, release, retry, fall back.

:class:`PrivateTokenSelector` turns the teachers' next-token distributions into one public token:
a draw of the (coordinated) ensemble, one private aggregation (a Gaussian release recorded on the
privacy ledger), retries with fresh shared randomness, and the public prompt's own token when the
ensemble stays silent.  :func:`generate_record` repeats that until a record ends.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
from scipy.stats import norm

from wasp_vllm.hotpate.aggregators import VOTE_SENSITIVITY, Aggregator
from wasp_vllm.hotpate.ensembles import ENSEMBLE_KINDS, EnsembleKind, PreparedEnsemble
from wasp_vllm.hotpate.teachers import DistributionSource
from wasp_vllm.privacy.accountant import GaussianRelease, PrivacyBudgetExceeded, PrivacyLedger

log = logging.getLogger(__name__)

Fallback = Callable[[np.ndarray, Sequence[int], np.random.Generator], int | None]
#: Builds a distribution source from prompts (teachers first, the public prompt last).
SourceFactory = Callable[[list[str]], DistributionSource]
Neighbour = Literal["add_remove", "replace"]
#: Below this chance of clearing the threshold, a release is not worth its privacy cost.
UNREACHABLE_P = 1e-9


def sample_public(public_probs: np.ndarray, tokens_so_far: Sequence[int], rng: np.random.Generator) -> int:
    """The paper's Remark 1: when the teachers give nothing, sample the public prompt's distribution."""
    p = np.asarray(public_probs, dtype=np.float64)
    return int(rng.choice(p.size, p=p / p.sum()))


def vote_sensitivity(neighbour: Neighbour) -> float:
    """L2 sensitivity of one release: one record is in one teacher (two when replaced)."""
    if neighbour == "add_remove":
        return VOTE_SENSITIVITY
    if neighbour == "replace":
        return 2.0
    raise ValueError(f"neighbour must be 'add_remove' or 'replace', got {neighbour!r}")


# --------------------------------------------------------------------------------------------
# one token
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TokenDecision:
    """The next public token and where it came from (``private``, ``fallback`` or ``budget``)."""

    token: int | None
    source: str
    releases: int


class PrivateTokenSelector:
    """Draw, release, retry, fall back: one public token from the teachers' distributions."""

    def __init__(
        self,
        aggregator: Aggregator,
        ensemble: EnsembleKind = "coordinated",
        ledger: PrivacyLedger | None = None,
        max_retries: int = 2,
        fallback: Fallback = sample_public,
        rng: np.random.Generator | None = None,
        neighbour: Neighbour = "add_remove",
        noise_rng: np.random.Generator | None = None,
    ) -> None:
        if ensemble not in ENSEMBLE_KINDS:
            raise ValueError(f"ensemble must be one of {ENSEMBLE_KINDS}, got {ensemble!r}")
        if max_retries < 0:
            raise ValueError("max_retries must be >= 0")
        if ledger is not None and aggregator.sigma <= 0:
            raise ValueError("a privacy ledger needs sigma > 0 (sigma 0 releases the true histogram)")
        self.aggregator = aggregator
        self.ensemble = ensemble
        self.ledger = ledger
        self.max_retries = max_retries
        self.fallback = fallback
        # Shared coordination randomness and the fallback may be public; the noise may not.
        self.rng = rng if rng is not None else np.random.default_rng()
        self.noise_rng = noise_rng if noise_rng is not None else np.random.default_rng()
        self.neighbour = neighbour
        self.sensitivity = vote_sensitivity(neighbour)
        self.releases = 0

    def _charge(self) -> bool:
        """Record one release on the ledger before it happens; False when the budget is spent."""
        if self.ledger is not None:
            try:
                release = GaussianRelease(
                    self.releases, self.aggregator.sigma, self.sensitivity, self.neighbour
                )
                self.ledger.record(release)
            except PrivacyBudgetExceeded:
                return False
        self.releases += 1
        return True

    def unreachable(self, n_teachers: int, vocab_size: int) -> bool:
        """True when even ``n`` unanimous votes clear the threshold with probability < 1e-9.

        Then a release could only return "nothing": skip it (no privacy spent) and use the
        fallback.  The decision uses public quantities only (threshold, n, sigma).
        """
        threshold = self.aggregator.resolve_threshold(n_teachers, vocab_size)
        sigma = self.aggregator.sigma
        if sigma == 0:
            return threshold > n_teachers
        return bool(norm.sf((threshold - n_teachers) / sigma) < UNREACHABLE_P)

    def select(
        self, teacher_probs: np.ndarray, public_probs: np.ndarray, tokens_so_far: Sequence[int]
    ) -> TokenDecision:
        """One token: up to ``1 + max_retries`` releases, then the fallback."""
        used = 0
        n, vocab = np.shape(teacher_probs)
        if self.unreachable(n, vocab):
            return TokenDecision(self.fallback(public_probs, tokens_so_far, self.rng), "fallback", 0)
        prepared = PreparedEnsemble(teacher_probs, self.ensemble)
        for _ in range(1 + self.max_retries):
            if not self._charge():
                return TokenDecision(None, "budget", used)
            used += 1
            hist = prepared.histogram(self.rng)
            result = self.aggregator(hist, self.rng, self.noise_rng)
            if result.token is not None:
                return TokenDecision(result.token, "private", used)
        return TokenDecision(self.fallback(public_probs, tokens_so_far, self.rng), "fallback", used)


# --------------------------------------------------------------------------------------------
# one record
# --------------------------------------------------------------------------------------------


@dataclass
class RecordOutcome:
    """Tokens of one record and how they were obtained (all public quantities)."""

    tokens: list[int] = field(default_factory=list)
    text: str = ""
    private: int = 0
    fallback: int = 0
    releases: int = 0
    end: str = "max_tokens"  # "eos", "stop", "max_tokens" or "budget"


def _cut_at_stop(text: str, stop: Sequence[str]) -> str | None:
    """``text`` up to the first stop string, or None when it holds none."""
    hits = [text.find(s) for s in stop if s and s in text]
    return text[: min(hits)] if hits else None


def generate_record(
    source: DistributionSource,
    selector: PrivateTokenSelector,
    max_tokens: int,
    prefix_ids: Sequence[int] = (),
    stop: Sequence[str] = (),
) -> RecordOutcome:
    """Generate one record; the last row of ``source`` is the public prompt (fallback only).

    ``prefix_ids`` (public, e.g. an opening quote) are appended to every teacher first and cost
    no privacy; generation ends at an end-of-sequence token, at a ``stop`` string in the
    decoded text (cut there), at ``max_tokens`` or when the privacy budget is spent.
    """
    source.reset()
    for token in prefix_ids:
        source.append(token)
    out = RecordOutcome()
    while len(out.tokens) < max_tokens:
        probs = source.next_distributions()
        decision = selector.select(probs[:-1], probs[-1], out.tokens)
        out.releases += decision.releases
        if decision.source == "budget":
            out.end = "budget"
            return out
        if decision.source == "private":
            out.private += 1
        else:
            out.fallback += 1
        if decision.token is None or decision.token in source.stop_token_ids:
            out.end = "eos"
            break
        out.tokens.append(decision.token)
        cut = _cut_at_stop(source.decode(out.tokens), stop)
        if cut is not None:
            out.text, out.end = cut, "stop"
            return out
        if len(out.tokens) < max_tokens:
            source.append(decision.token)
    out.text = source.decode(out.tokens)
    return out
