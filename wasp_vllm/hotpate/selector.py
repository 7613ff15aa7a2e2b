"""One token at a time from the teachers' distributions: draw, private step, retry, fall back.

:class:`PrivateTokenSelector` turns the teachers' next-token distributions into one public token:
a draw of the (coordinated) ensemble, one private step (:mod:`.steps`: a Gaussian release on the
ledger, or a target-charged stable argmax), retries with fresh shared randomness, and the public
prompt's own token when the ensemble gives nothing.  :func:`generate_record` repeats that until a
record ends.  A token comes from the public fallback for one of three public reasons:

* ``abstain``: every call of this token returned nothing (``⊥``, ``⊤`` or the "no token" bin);
* ``no_release``: the threshold is out of reach of even unanimous votes, so no call is made;
* ``budget``: the accountant allows no further call; the record (and the run) goes on with the
  fallback alone, so the run still writes every record it was asked for.

The token is always a function of the calls' outputs and public randomness (the coordination
draws and the fallback sampler, from ``rng``); the noise of each call comes from ``noise_rng``,
a stream of the run's secret key.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from wasp_vllm.hotpate.aggregators import Aggregator
from wasp_vllm.hotpate.ensembles import ENSEMBLE_KINDS, EnsembleKind, on_host, prepare_ensemble
from wasp_vllm.hotpate.steps import GaussianStep, Neighbour, PrivateStep
from wasp_vllm.hotpate.teachers import DistributionSource
from wasp_vllm.privacy.accountant import PrivacyLedger

log = logging.getLogger(__name__)

Fallback = Callable[[np.ndarray, Sequence[int], np.random.Generator], int | None]
#: Builds a distribution source from prompts: the teachers', or the public prompt alone (the
#: public row never shares a padded batch with a private prompt; see ``WithPublicRow``).
SourceFactory = Callable[[list[str]], DistributionSource]
#: Where a token came from: the ensemble, or the fallback for one of three public reasons.
SOURCES = ("private", "abstain", "no_release", "budget")


def sample_public(public_probs: np.ndarray, tokens_so_far: Sequence[int], rng: np.random.Generator) -> int:
    """The paper's Remark 1: when the teachers give nothing, sample the public prompt's distribution."""
    p = np.asarray(public_probs, dtype=np.float64)
    return int(rng.choice(p.size, p=p / p.sum()))


# --------------------------------------------------------------------------------------------
# one token
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TokenDecision:
    """The next public token, where it came from (one of :data:`SOURCES`) and the calls it made."""

    token: int | None
    source: str
    releases: int


class PrivateTokenSelector:
    """Draw, private step, retry, fall back: one public token from the teachers' distributions.

    ``step`` is a :class:`~wasp_vllm.hotpate.steps.PrivateStep`, or an :class:`Aggregator`, which is
    wrapped in a :class:`GaussianStep` charging ``ledger`` (if any) at the ``neighbour`` sensitivity.
    """

    def __init__(
        self,
        step: PrivateStep | Aggregator,
        ensemble: EnsembleKind = "coordinated",
        ledger: PrivacyLedger | None = None,
        max_retries: int = 2,
        fallback: Fallback = sample_public,
        rng: np.random.Generator | None = None,
        neighbour: Neighbour | str = Neighbour.ADD_REMOVE,
        noise_rng: np.random.Generator | None = None,
    ) -> None:
        if ensemble not in ENSEMBLE_KINDS:
            raise ValueError(f"ensemble must be one of {ENSEMBLE_KINDS}, got {ensemble!r}")
        if max_retries < 0:
            raise ValueError("max_retries must be >= 0")
        self.step: PrivateStep = (
            GaussianStep(step, ledger, neighbour) if isinstance(step, Aggregator) else step
        )
        self.ensemble = ensemble
        self.max_retries = max_retries
        self.fallback = fallback
        # Shared coordination randomness and the fallback may be public; the noise may not.
        self.rng = rng if rng is not None else np.random.default_rng()
        self.noise_rng = noise_rng if noise_rng is not None else np.random.default_rng()
        #: Why no private call can happen any more ("budget" or "no_release"), once it is known.
        self.silent: str | None = None

    @property
    def releases(self) -> int:
        """Private calls made so far."""
        return self.step.calls

    @property
    def aggregator(self) -> Aggregator:
        """The Gaussian step's aggregator (for a selector built from one)."""
        if not isinstance(self.step, GaussianStep):
            raise AttributeError("this selector's step is not a Gaussian release")
        return self.step.aggregator

    def unreachable(self, n_teachers: int, vocab_size: int) -> bool:
        """True when even unanimous votes would almost never yield: no call is made (public test)."""
        return self.step.unreachable(n_teachers, vocab_size)

    def fall_back(
        self, public_probs: Any, tokens_so_far: Sequence[int], reason: str, used: int,
        no_token: int | None = None,
    ) -> TokenDecision:  # fmt: skip
        """The public prompt's own token (never the "no token" bin); no private data involved."""
        public_probs = on_host(public_probs)  # one row: a GPU source's row is copied over
        if no_token is not None:
            public_probs = np.array(public_probs, dtype=np.float64)
            public_probs[no_token] = 0.0
        return TokenDecision(self.fallback(public_probs, tokens_so_far, self.rng), reason, used)

    def select(
        self,
        teacher_probs: Any,
        public_probs: Any,
        tokens_so_far: Sequence[int],
        no_token: int | None = None,
    ) -> TokenDecision:
        """One token: up to ``1 + max_retries`` private calls, then the fallback.

        The distributions are arrays, or tensors left on a GPU (the coordinated draw runs there).

        ``no_token`` is the id of a source's "no token" bin (the mass outside a top-K): the teachers
        may vote for it, but it is never returned - a call that picks it counts as nothing.
        """
        n, vocab = np.shape(teacher_probs)
        if self.step.unreachable(n, vocab):
            self.silent = "no_release"
            return self.fall_back(public_probs, tokens_so_far, "no_release", 0, no_token)
        prepared, used = prepare_ensemble(teacher_probs, self.ensemble), 0
        for _ in range(1 + self.max_retries):
            if not self.step.reserve():
                self.silent = "budget"  # a refused call stays refused: the accountant only grows
                return self.fall_back(public_probs, tokens_so_far, "budget", used, no_token)
            used += 1
            outcome = self.step.release(prepared.histogram(self.rng), self.rng, self.noise_rng)
            self.step.settle(outcome)
            if outcome.token is not None and outcome.token != no_token:
                return TokenDecision(outcome.token, "private", used)
        return self.fall_back(public_probs, tokens_so_far, "abstain", used, no_token)


# --------------------------------------------------------------------------------------------
# one record
# --------------------------------------------------------------------------------------------


@dataclass
class RecordOutcome:
    """Tokens of one record and how they were obtained (all public quantities)."""

    tokens: list[int] = field(default_factory=list)
    text: str = ""
    sources: dict[str, int] = field(default_factory=lambda: dict.fromkeys(SOURCES, 0))
    releases: int = 0
    end: str = "max_tokens"  # "eos", "stop" or "max_tokens"

    @property
    def private(self) -> int:
        return self.sources["private"]

    @property
    def fallback(self) -> int:
        """Tokens from the public fallback, whatever the reason."""
        return sum(v for k, v in self.sources.items() if k != "private")


def _cut_at_stop(text: str, stop: Sequence[str]) -> str | None:
    """``text`` up to the first stop string, or None when it holds none."""
    hits = [text.find(s) for s in stop if s and s in text]
    return text[: min(hits)] if hits else None


def _restart(source: DistributionSource, ids: Sequence[int]) -> DistributionSource:
    source.reset()
    for token in ids:
        source.append(token)
    return source


def generate_record(
    source: DistributionSource,
    selector: PrivateTokenSelector,
    max_tokens: int,
    prefix_ids: Sequence[int] = (),
    stop: Sequence[str] = (),
    public_source: DistributionSource | None = None,
) -> RecordOutcome:
    """Generate one record; the last row of ``source`` is the public prompt (fallback only).

    ``prefix_ids`` (public, e.g. an opening quote) are appended to every teacher first and cost
    no privacy; generation ends at an end-of-sequence token, at a ``stop`` string in the decoded
    text (cut there) or at ``max_tokens``.  A spent budget does not end it: the fallback goes on,
    on ``public_source`` (the public prompt alone, much cheaper) once the selector is silent.
    """
    active = _restart(source, prefix_ids)
    no_token = getattr(source, "no_token_id", None)
    out = RecordOutcome()
    while len(out.tokens) < max_tokens:
        if selector.silent and public_source is not None and active is not public_source:
            active = _restart(public_source, [*prefix_ids, *out.tokens])  # the same public tokens
        probs = active.next_distributions()
        if active is public_source and selector.silent:
            decision = selector.fall_back(probs[-1], out.tokens, selector.silent, 0, no_token)
        else:
            decision = selector.select(probs[:-1], probs[-1], out.tokens, no_token)
        out.releases += decision.releases
        out.sources[decision.source] += 1
        if decision.token is None or decision.token in source.stop_token_ids:
            out.end = "eos"
            break
        out.tokens.append(decision.token)
        cut = _cut_at_stop(active.decode(out.tokens), stop)
        if cut is not None:
            out.text, out.end = cut, "stop"
            return out
        if len(out.tokens) < max_tokens:
            active.append(decision.token)
    out.text = source.decode(out.tokens)
    return out
