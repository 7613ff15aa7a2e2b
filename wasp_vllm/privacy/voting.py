"""Private voting: the only step of WASP (with the noise right after it) that reads private data.

Each private sample j gives weights ``1, 1/2, ..., 1/2^(q-1)`` to its ``q`` nearest synthetic
samples of its label in ``H_near`` and to its ``q`` furthest in ``H_far`` (see
:mod:`wasp_vllm.privacy.search`).  A run whose prompts never show the far pool releases ``H_near``
alone (``far=False``): what is never used is never released, nor paid for.  The *clean* histograms
are private-data-bearing and must never leave this module's callers un-noised; :func:`noisy_votes`
is the Gaussian mechanism whose sensitivity is :func:`wasp_vllm.privacy.accountant.wasp_sensitivity`.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import numpy as np

from wasp_vllm.privacy.search import topq_near_far

logger = logging.getLogger(__name__)


def vote_weights(q: int) -> np.ndarray:
    """Geometric vote weights ``1, 1/2, ..., 1/2^(q-1)`` (float64, length q).

    Geometric weights keep the sensitivity bounded independently of q: the squared norm is
    ``sum 4^-r < 4/3`` per histogram.
    """
    if isinstance(q, bool) or not isinstance(q, (int, np.integer)) or q < 1:
        raise ValueError(f"q must be an integer >= 1, got {q!r}")
    return 0.5 ** np.arange(int(q), dtype=np.float64)


def histogram_from_indices(idx: np.ndarray, n_synth: int) -> np.ndarray:
    """Accumulate vote weights from an ``[M, q]`` index array (-1 = no sample) into a length-N vector."""
    idx = np.asarray(idx, dtype=np.int64)
    if idx.ndim != 2:
        raise ValueError(f"index array must be 2-D [M, q], got shape {idx.shape}")
    weights = np.broadcast_to(vote_weights(idx.shape[1]) if idx.shape[1] else np.zeros(0), idx.shape)
    mask = idx >= 0
    if np.any(idx[mask] >= n_synth):
        raise ValueError("index array refers to rows beyond the synthetic set")
    hist = np.zeros(n_synth, dtype=np.float64)
    np.add.at(hist, idx[mask], weights[mask])
    return hist


def clean_histograms(
    private_emb: np.ndarray,
    private_labels: np.ndarray,
    synth_emb: np.ndarray,
    synth_labels: np.ndarray,
    q: int,
) -> tuple[np.ndarray, np.ndarray]:
    """Un-noised ``(H_near, H_far)`` (float64, length N each).

    PRIVATE-DATA-BEARING: a deterministic function of the private embeddings.  Only for tests and
    for :func:`noisy_votes` / federated parties that add their noise share before anything leaves
    the voting step; never log, store or return it further.
    """
    near, far = topq_near_far(private_emb, private_labels, synth_emb, synth_labels, q)
    n_synth = np.asarray(synth_emb).shape[0]
    return histogram_from_indices(near, n_synth), histogram_from_indices(far, n_synth)


@dataclass(frozen=True, repr=False)
class Voters:
    """The private side of a vote: one embedding and label per record (and its party)."""

    embeddings: np.ndarray
    labels: np.ndarray
    parties: np.ndarray | None = None

    def __repr__(self) -> str:  # never print private embeddings
        return "Voters(...)"


@dataclass(frozen=True, eq=False)
class NoisyVotes:
    """Noised vote histograms - safe to release (post-processing of a Gaussian mechanism).

    ``eq=False``: equality of array fields is ambiguous, so instances compare by identity.
    ``h_far`` is None where only ``H_near`` was released.
    """

    h_near: np.ndarray
    h_far: np.ndarray | None
    sigma: float
    q: int


def add_noise(
    h_near: np.ndarray, h_far: np.ndarray | None, sigma: float, rng: np.random.Generator, q: int = 0
) -> NoisyVotes:
    """Add i.i.d. ``N(0, sigma^2)`` to every coordinate of both histograms (one sigma for all), or of
    ``h_near`` alone where ``h_far`` is None.

    ``rng`` must be a seeded ``numpy.random.Generator`` owned by the caller so runs are
    reproducible and resumable; ``H_near`` takes the same draws either way.  ``q`` is only carried
    along for the record.
    """
    if not isinstance(rng, np.random.Generator):
        raise ValueError("rng must be a numpy.random.Generator")
    if isinstance(sigma, bool) or not math.isfinite(float(sigma)) or float(sigma) <= 0.0:
        raise ValueError(f"sigma must be finite and > 0, got {sigma!r}")
    h_near = np.asarray(h_near, dtype=np.float64)
    released = [h_near] if h_far is None else [h_near, np.asarray(h_far, dtype=np.float64)]
    if h_near.ndim != 1 or any(h.shape != h_near.shape for h in released):
        shapes = " and ".join(str(h.shape) for h in released)
        raise ValueError(f"histograms must be 1-D of equal length, got {shapes}")
    sigma = float(sigma)
    noise = rng.normal(0.0, sigma, size=(len(released), h_near.shape[0]))
    noisy = [h + row for h, row in zip(released, noise, strict=True)]
    return NoisyVotes(h_near=noisy[0], h_far=noisy[1] if h_far is not None else None, sigma=sigma, q=int(q))


def noisy_votes(
    private_emb: np.ndarray,
    private_labels: np.ndarray,
    synth_emb: np.ndarray,
    synth_labels: np.ndarray,
    q: int,
    sigma: float,
    rng: np.random.Generator,
    far: bool = True,
) -> NoisyVotes:
    """The Gaussian mechanism of one voting round: clean histograms plus ``N(0, sigma^2)`` noise
    (``far=False``: ``H_near`` alone; the clean ``H_far`` is dropped unseen)."""
    h_near, h_far = clean_histograms(private_emb, private_labels, synth_emb, synth_labels, q)
    votes = add_noise(h_near, h_far if far else None, sigma, rng, q=q)
    logger.debug("voting: %d synthetic samples noised with sigma=%.6g (q=%d)", h_near.shape[0], sigma, q)
    return votes
