"""Teacher ensembles: turn the teachers' next-token distributions into one vote each.

Two ways of drawing the votes (Hot PATE, Cohen et al., section on coordinated ensembles):

* **independent** ("cold" PATE): every teacher samples its own token from its own
  distribution.  When the teachers are diverse (several good next tokens), the votes spread
  over those tokens, every count is about ``n / r`` and, by concentration, no count is far
  above its mean - so a threshold that protects privacy is rarely cleared.
* **coordinated**: one shared random vector ``u_j ~ Exp(1)`` (one entry per vocabulary
  token) and every teacher votes ``argmax_j p_ij / u_j``.  For each single teacher this is
  *exactly* a sample from ``p_i`` (exponential race: ``u_j / p_ij ~ Exp(p_ij)`` and the
  minimum of independent exponentials falls on ``j`` with probability ``p_ij``), but teachers
  with similar distributions now vote for the *same* token: the histogram is sharp, with a
  high count on a token that changes from draw to draw.  Diversity moves from the histogram
  into the shared randomness, where it costs no privacy.

Either way each teacher contributes exactly one vote, so changing one teacher's data moves
one vote from one bin to another: L2 sensitivity ``sqrt(2)`` of the histogram.

The histogram is returned sparse (token ids + counts): ``n`` votes hit at most ``n`` bins of
a vocabulary of ~50k-260k tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

EnsembleKind = Literal["coordinated", "independent"]
ENSEMBLE_KINDS: tuple[str, ...] = ("coordinated", "independent")


@dataclass(frozen=True)
class VoteHistogram:
    """Sparse vote counts of one ensemble draw.

    ``tokens`` are sorted, distinct token ids; ``counts[k]`` is the number of teachers that
    voted ``tokens[k]``; ``counts.sum() == n_teachers``.  The true counts are private: only a
    noisy version of them may leave the process (see :mod:`wasp_vllm.hotpate.aggregators`).
    """

    tokens: np.ndarray
    counts: np.ndarray
    n_teachers: int
    vocab_size: int

    @classmethod
    def from_votes(cls, votes: np.ndarray, vocab_size: int) -> VoteHistogram:
        """Count one vote per teacher."""
        votes = np.asarray(votes, dtype=np.int64)
        if votes.ndim != 1:
            raise ValueError("votes must be one token id per teacher (a 1-d array)")
        if votes.size and (votes.min() < 0 or votes.max() >= vocab_size):
            raise ValueError("a vote lies outside the vocabulary")
        tokens, counts = np.unique(votes, return_counts=True)
        return cls(tokens, counts.astype(np.int64), int(votes.size), int(vocab_size))

    def dense(self) -> np.ndarray:
        """The full histogram over the vocabulary (float64, for adding noise)."""
        out = np.zeros(self.vocab_size, dtype=np.float64)
        out[self.tokens] = self.counts
        return out

    def count(self, token: int) -> int:
        """Votes for ``token`` (0 when nobody voted for it)."""
        hit = np.searchsorted(self.tokens, token)
        if hit < self.tokens.size and self.tokens[hit] == token:
            return int(self.counts[hit])
        return 0


def _check_probs(probs: np.ndarray) -> np.ndarray:
    probs = np.asarray(probs)
    if probs.ndim != 2 or probs.shape[0] == 0 or probs.shape[1] == 0:
        raise ValueError("probs must be a non-empty [n_teachers, vocab] array")
    return probs


def shared_gumbel(rng: np.random.Generator, vocab_size: int) -> np.ndarray:
    """The coordinated draw's shared noise ``-log u``, ``u ~ Exp(1)`` per token (float64, host)."""
    return -np.log(rng.exponential(1.0, size=vocab_size))


class PreparedEnsemble:
    """Teachers' distributions preprocessed once, for many draws of the ensemble.

    A coordinated draw needs ``log p`` and an independent draw the per-row CDF; computing them
    once matters when the same distributions are redrawn thousands of times (the coverage
    benchmark) or retried several times for one token.
    """

    def __init__(self, probs: np.ndarray, kind: EnsembleKind) -> None:
        if kind not in ENSEMBLE_KINDS:
            raise ValueError(f"ensemble must be one of {ENSEMBLE_KINDS}, got {kind!r}")
        probs = _check_probs(probs)
        self.kind = kind
        self.n_teachers, self.vocab_size = probs.shape
        if kind == "coordinated":
            with np.errstate(divide="ignore"):
                # Zero probabilities stay at -inf: a teacher never votes for a token it rules out.
                self._table = np.log(probs)
        else:
            self._table = np.cumsum(probs, axis=1, dtype=np.float64)

    def votes(self, rng: np.random.Generator) -> np.ndarray:
        """One vote per teacher (fresh randomness on every call)."""
        if self.kind == "coordinated":
            # argmax_j p_ij / u_j with one shared u ~ Exp(1): a Gumbel-max whose Gumbel noise
            # (-log u) is shared by all teachers; no division by tiny u.
            shared = shared_gumbel(rng, self.vocab_size)
            return (self._table + shared[None, :]).argmax(axis=1).astype(np.int64)
        cdf = self._table
        # Inverse CDF with one uniform per teacher, scaled by the row total (rounding-safe).
        draws = rng.random(self.n_teachers) * cdf[:, -1]
        votes = (cdf <= draws[:, None]).sum(axis=1)
        return np.minimum(votes, self.vocab_size - 1).astype(np.int64)

    def histogram(self, rng: np.random.Generator) -> VoteHistogram:
        """Draw once and count the votes."""
        return VoteHistogram.from_votes(self.votes(rng), self.vocab_size)


class DeviceCoordinatedEnsemble:
    """The coordinated draw where the teachers' distributions already are (a GPU tensor).

    The same draw as :class:`PreparedEnsemble`: the shared ``-log u`` comes from the same host
    generator, in the same order, and is added in float64 to the float32 ``log p``; only the
    ``n_teachers`` votes cross to the host, not the ``[n_teachers, vocab]`` table (236 MB a token
    for 1,200 teachers of SmolLM2, whose host-side log and argmax took about a second a token).
    Each row's vote is its own row's argmax, so no teacher's vote depends on another's prompt.
    """

    kind: EnsembleKind = "coordinated"

    def __init__(self, probs: Any) -> None:
        import torch

        if probs.ndim != 2 or probs.shape[0] == 0 or probs.shape[1] == 0:
            raise ValueError("probs must be a non-empty [n_teachers, vocab] tensor")
        self.n_teachers, self.vocab_size = (int(d) for d in probs.shape)
        self._table = torch.log(probs)  # zeros stay at -inf, as on the host

    def votes(self, rng: np.random.Generator) -> np.ndarray:
        import torch

        shared = torch.from_numpy(shared_gumbel(rng, self.vocab_size))
        scores = self._table.double() + shared.to(self._table.device)[None, :]
        return scores.argmax(dim=1).cpu().numpy().astype(np.int64)

    def histogram(self, rng: np.random.Generator) -> VoteHistogram:
        return VoteHistogram.from_votes(self.votes(rng), self.vocab_size)


def is_tensor(probs: Any) -> bool:
    """A torch tensor (without importing torch); a NumPy 2 array has ``device`` too, not ``cpu``."""
    return hasattr(probs, "cpu") and not isinstance(probs, np.ndarray)


def on_host(probs: Any) -> np.ndarray:
    """A distribution array on the host: a tensor is copied over, an array passes through."""
    return probs.cpu().numpy() if is_tensor(probs) else np.asarray(probs)


def prepare_ensemble(probs: Any, kind: EnsembleKind) -> PreparedEnsemble | DeviceCoordinatedEnsemble:
    """The ensemble drawn where ``probs`` lives: a tensor's coordinated draw stays on its device;
    everything else (arrays, independent draws) runs on the host."""
    if kind == "coordinated" and is_tensor(probs):
        return DeviceCoordinatedEnsemble(probs)
    return PreparedEnsemble(on_host(probs), kind)


def coordinated_votes(probs: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """One vote per teacher from one shared draw ``u_j ~ Exp(1)``: ``argmax_j p_ij / u_j``."""
    return PreparedEnsemble(probs, "coordinated").votes(rng)


def independent_votes(probs: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """One vote per teacher, each sampled on its own (inverse CDF with its own uniform)."""
    return PreparedEnsemble(probs, "independent").votes(rng)


def draw_votes(probs: np.ndarray, kind: EnsembleKind, rng: np.random.Generator) -> np.ndarray:
    """Votes of a coordinated or an independent ensemble."""
    if kind == "coordinated":
        return coordinated_votes(probs, rng)
    if kind == "independent":
        return independent_votes(probs, rng)
    raise ValueError(f"ensemble must be one of {ENSEMBLE_KINDS}, got {kind!r}")


def vote_histogram(probs: np.ndarray, kind: EnsembleKind, rng: np.random.Generator) -> VoteHistogram:
    """Draw the ensemble once and count its votes."""
    return VoteHistogram.from_votes(draw_votes(probs, kind, rng), np.asarray(probs).shape[1])
