"""Post-processing of the noisy votes: in-context pools, PLM weights and generation quotas.

Nothing here reads private data: the inputs are the *noisy* histograms (or plain counts), so every
function is differential-privacy post-processing.  All functions are deterministic (ties go to the
lower index) so a resumed run reproduces the same choices.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import numpy as np

logger = logging.getLogger(__name__)


@dataclass(frozen=True, eq=False)
class PoolIndices:
    """Per-label in-context pools: global synthetic row indices (int64), best-ranked first.

    ``good`` and ``bad`` are disjoint.
    """

    good: np.ndarray
    bad: np.ndarray


# ------------------------------------------------------------------------------------------------
# validation helpers
# ------------------------------------------------------------------------------------------------


def _check_count(name: str, value: int, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def _float_vector(name: str, x: np.ndarray, length: int | None = None) -> np.ndarray:
    arr = np.asarray(x, dtype=np.float64)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {arr.shape}")
    if length is not None and arr.shape[0] != length:
        raise ValueError(f"{name} must have length {length}, got {arr.shape[0]}")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} contains NaN or infinite values")
    return arr


def _int_vector(name: str, x: np.ndarray, upper: int, length: int | None = None) -> np.ndarray:
    arr = np.asarray(x)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {arr.shape}")
    if length is not None and arr.shape[0] != length:
        raise ValueError(f"{name} must have length {length}, got {arr.shape[0]}")
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"{name} must have an integer dtype, got {arr.dtype}")
    arr = arr.astype(np.int64, copy=False)
    if arr.size and (arr.min() < 0 or arr.max() >= upper):
        raise ValueError(f"{name} values must lie in [0, {upper})")
    return arr


# ------------------------------------------------------------------------------------------------
# pools
# ------------------------------------------------------------------------------------------------


def _ranked(rows: np.ndarray, scores: np.ndarray) -> np.ndarray:
    """``rows`` ordered by descending score, ties by lower row index."""
    return rows[np.lexsort((rows, -scores[rows]))]


def _draft(order_good: np.ndarray, order_bad: np.ndarray, s: int) -> PoolIndices:
    """Alternating draft: good picks its best untaken sample, then bad does, until both hold ``s``.

    A sample in both top-S lists thus lands in the pool that reaches it first - the one where its
    rank among the untaken samples is better, good on equal rank - and the other pool takes its
    next-best sample instead.  With fewer than ``2s`` samples the label's samples are split
    (good gets the extra one).  ``order_good`` may rank fewer samples than ``order_bad`` (those the
    good pool may take).
    """
    taken: set[int] = set()
    picks: tuple[list[int], list[int]] = ([], [])  # good, bad
    orders, places = (order_good, order_bad), [0, 0]
    progressed = True
    while progressed and min(len(p) for p in picks) < s:
        progressed = False
        for side in (0, 1):  # good first: it gets the extra sample of an odd split
            order, chosen = orders[side], picks[side]
            while places[side] < len(order) and int(order[places[side]]) in taken:
                places[side] += 1
            if len(chosen) < s and places[side] < len(order):
                chosen.append(int(order[places[side]]))
                taken.add(chosen[-1])
                progressed = True
    good, bad = picks
    return PoolIndices(good=np.asarray(good, dtype=np.int64), bad=np.asarray(bad, dtype=np.int64))


def select_pools(
    h_near: np.ndarray,
    h_far: np.ndarray | None,
    synth_labels: np.ndarray,
    s: int,
    n_labels: int,
    eligible: np.ndarray | None = None,
) -> dict[int, PoolIndices]:
    """Per label: ``good`` = top-``s`` of noisy ``H_near``, ``bad`` = top-``s`` of noisy ``H_far``.

    Pools are disjoint (overlaps resolved by :func:`_draft`), ordered best-first, ties to the lower
    row index.  Every label in ``range(n_labels)`` gets an entry; a label without synthetic samples
    gets two empty pools, one with fewer than ``2s`` samples gets smaller pools.  Without ``H_far``
    (a run that never shows the far pool releases none) ``good`` is the plain top-``s`` and ``bad``
    is empty.  ``eligible`` (a boolean mask; a round policy's filter) limits the good pool to those
    samples; the bad pool may take any.
    """
    n_labels = _check_count("n_labels", n_labels, 1)
    s = _check_count("s", s, 0)
    labels = _int_vector("synth_labels", synth_labels, n_labels)
    near = _float_vector("h_near", h_near, labels.shape[0])
    far = None if h_far is None else _float_vector("h_far", h_far, labels.shape[0])
    if eligible is None:
        eligible = np.ones(labels.shape[0], dtype=bool)
    eligible = np.asarray(eligible, dtype=bool)
    if eligible.shape != labels.shape:
        raise ValueError(f"eligible must have shape {labels.shape}, got {eligible.shape}")
    pools: dict[int, PoolIndices] = {}
    for label in range(n_labels):
        rows = np.flatnonzero(labels == label)
        order_good = _ranked(rows[eligible[rows]], near)
        if far is None:
            pools[label] = PoolIndices(good=order_good[:s].astype(np.int64), bad=np.zeros(0, dtype=np.int64))
        else:
            pools[label] = _draft(order_good, _ranked(rows, far), s)
    return pools


# ------------------------------------------------------------------------------------------------
# PLM weights
# ------------------------------------------------------------------------------------------------


def plm_scores(h_near: np.ndarray, synth_plm: np.ndarray, n_plms: int) -> np.ndarray:
    """Unclipped ``score_k = sum_{i from k} H_near[i] / (|D_k| / |D|)`` (0 for a PLM with no samples).

    This is the paper's score times the common factor ``sum(H_near)``; leaving that factor out
    means a non-positive noisy total never divides or flips signs, and it cancels on normalising.
    Raw noisy votes are summed (not clipped), so each score stays an unbiased estimate.
    """
    n_plms = _check_count("n_plms", n_plms, 1)
    plm = _int_vector("synth_plm", synth_plm, n_plms)
    votes = _float_vector("h_near", h_near, plm.shape[0])
    counts = np.bincount(plm, minlength=n_plms).astype(np.float64)
    sums = np.bincount(plm, weights=votes, minlength=n_plms)
    scores = np.zeros(n_plms, dtype=np.float64)
    has = counts > 0
    scores[has] = sums[has] * (plm.shape[0] / counts[has])
    return scores


def _normalised_prev(prev_weights: np.ndarray, n_plms: int) -> np.ndarray:
    """Last round's weights, checked and normalised: what a weight rule returns when the votes
    carry no usable signal."""
    prev = _float_vector("prev_weights", prev_weights, n_plms)
    if np.any(prev < 0) or prev.sum() <= 0:
        raise ValueError("prev_weights must be non-negative with a positive sum")
    return prev / prev.sum()


def plm_weights(
    h_near: np.ndarray, synth_plm: np.ndarray, n_plms: int, prev_weights: np.ndarray
) -> np.ndarray:
    """Next round's PLM weights from the noisy near-votes.

    Negative noise is handled at the *score* level: per-PLM sums of raw noisy votes (unbiased) are
    clipped at 0, then normalised to sum 1.  If no PLM has a positive score the votes carry no
    usable signal and ``prev_weights`` (normalised) is returned.  Never negative, never NaN.
    """
    n_plms = _check_count("n_plms", n_plms, 1)
    prev = _normalised_prev(prev_weights, n_plms)
    scores = np.clip(plm_scores(h_near, synth_plm, n_plms), 0.0, None)
    total = math.fsum(scores)
    if not total > 0.0:
        logger.info("plm_weights: no positive PLM score, keeping previous weights")
        return prev
    return scores / total


# ------------------------------------------------------------------------------------------------
# quotas
# ------------------------------------------------------------------------------------------------


def _largest_remainder(total: int, shares: np.ndarray) -> np.ndarray:
    """Integers summing to ``total`` proportional to ``shares``; leftovers by largest fraction,
    ties to the lower index."""
    ideal = total * shares / shares.sum()
    base = np.floor(ideal).astype(np.int64)
    left = total - int(base.sum())
    if left > 0:
        frac = ideal - base
        order = np.lexsort((np.arange(len(frac)), -frac))
        base[order[:left]] += 1
    elif left < 0:  # float round-off only; take from the smallest fractions
        frac = ideal - base
        order = np.lexsort((-np.arange(len(frac)), frac))
        order = order[base[order] > 0]
        base[order[:-left]] -= 1
    return base


def allocate_quotas(total: int, weights: np.ndarray, floor: int = 0) -> np.ndarray:
    """Split ``total`` samples over PLMs in proportion to ``weights``, each getting >= ``floor``.

    Water-filling: PLMs whose proportional share falls below ``floor`` are pinned at ``floor`` and
    the rest is shared among the others in proportion to their weights, then rounded by largest
    remainder (ties to the lower index), so the result sums to exactly ``total``.
    """
    total = _check_count("total", total, 0)
    floor = _check_count("floor", floor, 0)
    w = _float_vector("weights", weights)
    if w.size == 0:
        raise ValueError("weights must not be empty")
    if np.any(w < 0) or w.sum() <= 0:
        raise ValueError("weights must be non-negative with a positive sum")
    k = w.size
    if floor * k > total:
        raise ValueError(f"floor={floor} for {k} PLMs needs {floor * k} samples but total is {total}")
    pinned = np.zeros(k, dtype=bool)
    while True:
        free = ~pinned & (w > 0)
        rest = total - floor * int(np.sum(~free))
        if not free.any():
            break
        ideal = rest * w[free] / w[free].sum()
        low = ideal < floor
        if not low.any():
            break
        pinned[np.flatnonzero(free)[low]] = True
    out = np.full(k, floor, dtype=np.int64)
    if free.any():
        out[free] = _largest_remainder(rest, w[free])
    else:  # every weight pinned: hand the leftovers out evenly, lower index first
        out += split_over_labels(rest, k)
    return out


def split_over_labels(n: int, n_labels: int, offset: int = 0) -> np.ndarray:
    """Spread ``n`` samples as evenly as possible over ``n_labels`` labels.

    The ``n % n_labels`` extra samples go to labels ``offset, offset+1, ...`` (mod ``n_labels``), so
    callers can rotate ``offset`` (e.g. by round and PLM) and small quotas do not always favour
    label 0.
    """
    n = _check_count("n", n, 0)
    n_labels = _check_count("n_labels", n_labels, 1)
    if isinstance(offset, bool) or not isinstance(offset, (int, np.integer)):
        raise ValueError(f"offset must be an integer, got {offset!r}")
    out = np.full(n_labels, n // n_labels, dtype=np.int64)
    extra = (int(offset) + np.arange(n % n_labels)) % n_labels
    out[extra] += 1
    return out


# ------------------------------------------------------------------------------------------------
# label shares
# ------------------------------------------------------------------------------------------------

#: Smallest share a label keeps, so a rare (or noisy-zero) label still gets pools and samples.
MIN_LABEL_SHARE = 0.05


def label_shares(noisy_counts: np.ndarray) -> np.ndarray:
    """Shares of the labels from a noisy histogram (post-processing): clipped at 0, floored at
    :data:`MIN_LABEL_SHARE`, summing to 1."""
    counts = np.clip(_float_vector("noisy_counts", noisy_counts), 0.0, None)
    even = np.full(counts.size, 1.0 / counts.size)
    shares = counts / counts.sum() if counts.sum() > 0 else even
    shares = np.maximum(shares, MIN_LABEL_SHARE)
    return shares / shares.sum()
