"""Exact per-label Top-q nearest and furthest synthetic samples (the only distance search in WASP).

Every private sample votes for the ``q`` nearest and the ``q`` furthest synthetic samples *of its own
label*.  The vote vector's sensitivity analysis assumes those sets are exactly defined, so the search
must be exact and deterministic:

* FAISS flat (brute-force) indices per label propose candidates: ``IndexFlatL2`` for the nearest,
  and ``IndexFlatIP`` on augmented vectors for the furthest (``|x - z|^2 = |x|^2 + <[z, |z|^2],
  [-2x, 1]>``, so the largest inner product is the furthest point).  Data are centred on the
  label's synthetic mean first, which keeps float32 cancellation small.
* The candidates (more than ``q``) are rescored in float64 with ``sum((x - z)^2)`` on the original
  inputs and ordered by ``(distance, row index)`` - nearest-first with ties to the lower row index,
  or ``(-distance, row index)`` - furthest-first with ties to the lower row index.
* A float32 error bound certifies that no sample outside the candidate set could enter the Top-q
  (strictly); rows that cannot be certified are recomputed by float64 brute force.  The result is
  therefore identical to a float64 brute force with the same tie rule.

A FAISS GPU index is used when one is present (``use_gpu=None``); the GPU branch only swaps the
index object.
"""

from __future__ import annotations

import logging
from functools import lru_cache
from importlib import metadata
from typing import Any

import numpy as np

from wasp_vllm.privacy.logs import debug_private

logger = logging.getLogger(__name__)

#: FAISS GPU flat search supports at most this many neighbours per query.
_GPU_MAX_K = 2048
#: float32 unit round-off.
_U32 = float(np.finfo(np.float32).eps)


def _as_embeddings(name: str, x: np.ndarray) -> np.ndarray:
    arr = np.asarray(x)
    if arr.ndim != 2:
        raise ValueError(f"{name} must be a 2-D array [rows, dim], got shape {arr.shape}")
    if not np.issubdtype(arr.dtype, np.floating):
        raise ValueError(f"{name} must have a floating dtype, got {arr.dtype}")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} contains NaN or infinite values")
    return arr


def _as_labels(name: str, labels: np.ndarray, rows: int) -> np.ndarray:
    arr = np.asarray(labels)
    if arr.ndim != 1 or arr.shape[0] != rows:
        raise ValueError(f"{name} must be a 1-D array of length {rows}, got shape {arr.shape}")
    if rows and not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"{name} must have an integer dtype, got {arr.dtype}")
    return arr.astype(np.int64, copy=False)


def _validate(private_emb, private_labels, synth_emb, synth_labels, q):
    """Check shapes/dtypes once; returns float64 copies of the embeddings and int64 labels."""
    if isinstance(q, bool) or not isinstance(q, (int, np.integer)) or q < 1:
        raise ValueError(f"q must be an integer >= 1, got {q!r}")
    p = _as_embeddings("private_emb", private_emb)
    s = _as_embeddings("synth_emb", synth_emb)
    if p.shape[1] != s.shape[1]:
        raise ValueError(f"embedding dims differ: private {p.shape[1]} vs synthetic {s.shape[1]}")
    if p.shape[1] == 0:
        raise ValueError("embeddings must have at least one dimension")
    pl = _as_labels("private_labels", private_labels, p.shape[0])
    sl = _as_labels("synth_labels", synth_labels, s.shape[0])
    return p.astype(np.float64, copy=False), pl, s.astype(np.float64, copy=False), sl, int(q)


# ------------------------------------------------------------------------------------------------
# FAISS indices
# ------------------------------------------------------------------------------------------------


def _faiss():
    import faiss  # imported lazily: the module stays importable for pure-logic users

    return faiss


def gpu_available() -> bool:
    """True when FAISS sees at least one GPU (the faiss-cpu wheel never does)."""
    try:
        faiss = _faiss()
    except ImportError:
        return False
    return hasattr(faiss, "get_num_gpus") and faiss.get_num_gpus() > 0


#: FAISS's wheels on PyPI; they all provide the one module ``faiss``, so the distribution tells
#: which build is installed (``.[gpu]`` installs faiss-gpu-cu12, ``.[cpu]`` faiss-cpu).
FAISS_DISTRIBUTIONS = ("faiss-gpu-cu12", "faiss-gpu-cu11", "faiss-gpu-cuvs", "faiss-gpu", "faiss-cpu")


def faiss_build() -> dict[str, Any]:
    """Which FAISS build this process searches with (published in the manifest, shown by doctor).

    ``gpu_code``: the build has FAISS's GPU code (``StandardGpuResources``); ``gpus``: the GPUs it
    sees; ``searches_on``: where :func:`topq_near_far` runs by default."""
    try:
        faiss = _faiss()
    except ImportError:
        return {"distribution": None, "gpu_code": False, "gpus": 0,
                "searches_on": "cpu (float64 brute force: FAISS is not installed)"}  # fmt: skip
    distribution = next((d for d in FAISS_DISTRIBUTIONS if _installed(d)), "faiss (unknown wheel)")
    gpus = int(faiss.get_num_gpus()) if hasattr(faiss, "get_num_gpus") else 0
    return {  # its version is in the manifest's ``versions``
        "distribution": distribution,
        "gpu_code": hasattr(faiss, "StandardGpuResources"),
        "gpus": gpus,
        "searches_on": "gpu" if gpus > 0 else "cpu",
    }


def _installed(distribution: str) -> bool:
    try:
        metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return False
    return True


@lru_cache(maxsize=1)
def _has_faiss() -> bool:
    try:
        _faiss()
    except ImportError:
        return False
    return True


@lru_cache(maxsize=1)
def _gpu_resources():
    return _faiss().StandardGpuResources()


def _flat_index(vectors: np.ndarray, inner_product: bool, use_gpu: bool, k: int):
    """A flat (exact) FAISS index over ``vectors``; on the GPU when asked and ``k`` is supported."""
    faiss = _faiss()
    dim = vectors.shape[1]
    index = faiss.IndexFlatIP(dim) if inner_product else faiss.IndexFlatL2(dim)
    if use_gpu and k <= _GPU_MAX_K:
        index = faiss.index_cpu_to_gpu(_gpu_resources(), 0, index)
    index.add(np.ascontiguousarray(vectors, dtype=np.float32))
    return index


def _faiss_candidates(queries: np.ndarray, base: np.ndarray, k: int, furthest: bool, use_gpu: bool):
    """Top-k candidates under float32 arithmetic and their approximate squared distances.

    ``queries`` and ``base`` are already centred (float64).  Returns (local indices [m, k],
    approximate squared distances [m, k]).  Values beyond float32 range become inf here; the
    caller then falls back to float64, so the overflow warning is silenced.
    """
    with np.errstate(over="ignore", invalid="ignore"):
        return _faiss_search(queries, base, k, furthest, use_gpu)


def _faiss_search(queries: np.ndarray, base: np.ndarray, k: int, furthest: bool, use_gpu: bool):
    if furthest:
        base_aug = np.hstack([base, np.sum(base * base, axis=1, keepdims=True)])
        query_aug = np.hstack([-2.0 * queries, np.ones((queries.shape[0], 1))])
        index = _flat_index(base_aug, inner_product=True, use_gpu=use_gpu, k=k)
        scores, local = index.search(np.ascontiguousarray(query_aug, dtype=np.float32), k)
        approx = scores.astype(np.float64) + np.sum(queries * queries, axis=1, keepdims=True)
    else:
        index = _flat_index(base, inner_product=False, use_gpu=use_gpu, k=k)
        approx, local = index.search(np.ascontiguousarray(queries, dtype=np.float32), k)
        approx = approx.astype(np.float64)
    return local.astype(np.int64), approx


# ------------------------------------------------------------------------------------------------
# exact rescoring
# ------------------------------------------------------------------------------------------------


def _sqdist(x: np.ndarray, z: np.ndarray) -> np.ndarray:
    """float64 squared distances from one point ``x`` [d] to rows of ``z`` [n, d] (no cancellation)."""
    diff = z - x
    return np.einsum("ij,ij->i", diff, diff)


def _order(dist: np.ndarray, rows: np.ndarray, furthest: bool) -> np.ndarray:
    """Positions sorted nearest-first (or furthest-first), ties by lower global row index."""
    key = -dist if furthest else dist
    return np.lexsort((rows, key))


def _brute_row(x: np.ndarray, base: np.ndarray, rows: np.ndarray, k: int, furthest: bool) -> np.ndarray:
    dist = _sqdist(x, base)
    return rows[_order(dist, rows, furthest)[:k]]


def _certified(edge: float, kth: float, err: float, furthest: bool) -> bool:
    """True when no point outside the candidates can be (or tie with) the k-th exact distance.

    ``edge`` is the float32 distance of the last FAISS candidate: every non-candidate has a
    float32 distance beyond it, hence an exact distance beyond ``edge -/+ err``.
    """
    if not (np.isfinite(edge) and np.isfinite(err)):  # float32 overflow: certify nothing
        return False
    return edge + err < kth if furthest else edge - err > kth


def _search_label(
    queries: np.ndarray, base: np.ndarray, rows: np.ndarray, q: int, furthest: bool, use_gpu: bool
) -> np.ndarray:
    """Exact Top-min(q, n) for the queries of one label; returns global rows [m, min(q, n)]."""
    n, dim = base.shape
    k = min(q, n)
    kc = min(n, max(2 * k, k + 32))  # candidates beyond k give the certificate room
    if not _has_faiss():  # a plain install without the cpu/gpu extra: the exact reference itself
        return np.stack([_brute_row(x, base, rows, k, furthest) for x in queries]).reshape(-1, k)
    centre = base.mean(axis=0)
    qc, bc = queries - centre, base - centre
    local, approx = _faiss_candidates(qc, bc, kc, furthest, use_gpu)
    # Bound on the float32 distance error (input rounding + dot products, any summation order) for
    # any base point.  FAISS GPU keeps full FP32 GEMMs (it disallows reduced-precision cuBLAS math).
    bmax = float(np.sqrt(np.max(np.sum(bc * bc, axis=1))))
    err = 4.0 * (dim + 8) * _U32 * (np.sqrt(np.sum(qc * qc, axis=1)) + bmax) ** 2
    out = np.empty((queries.shape[0], k), dtype=np.int64)
    fallbacks = 0
    for i in range(queries.shape[0]):
        valid = local[i] >= 0
        cand = local[i][valid]
        dist = _sqdist(queries[i], base[cand])
        pos = _order(dist, rows[cand], furthest)[:k]
        complete = cand.size == kc and bool(np.all(np.isfinite(approx[i])))
        if complete and (kc == n or _certified(approx[i, -1], dist[pos[-1]], err[i], furthest)):
            out[i] = rows[cand[pos]]
        else:
            fallbacks += 1
            out[i] = _brute_row(queries[i], base, rows, k, furthest)
    if fallbacks:
        debug_private(logger, "search: %d of %d rows recomputed by float64 brute force", fallbacks, len(out))
    return out


# ------------------------------------------------------------------------------------------------
# public API
# ------------------------------------------------------------------------------------------------


def topq_near_far(
    private_emb: np.ndarray,
    private_labels: np.ndarray,
    synth_emb: np.ndarray,
    synth_labels: np.ndarray,
    q: int,
    *,
    use_gpu: bool | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Exact Top-q nearest and Top-q furthest synthetic rows of the same label, per private sample.

    Returns ``(near_idx, far_idx)``, int64 arrays of shape ``[M, q]`` holding global row indices
    into ``synth_emb``: nearest-first / furthest-first by L2 distance, ties broken by the lower row
    index, padded with -1 when the label has fewer than ``q`` synthetic samples (all -1 when it has
    none).  ``use_gpu=None`` uses a FAISS GPU index when one is available.
    """
    p, pl, s, sl, q = _validate(private_emb, private_labels, synth_emb, synth_labels, q)
    if use_gpu is None:
        use_gpu = gpu_available()
    m = p.shape[0]
    near = np.full((m, q), -1, dtype=np.int64)
    far = np.full((m, q), -1, dtype=np.int64)
    for label in np.unique(pl):
        prows = np.flatnonzero(pl == label)
        srows = np.flatnonzero(sl == label)
        if srows.size == 0:
            continue
        queries, base = p[prows], s[srows]
        k = min(q, srows.size)
        near[prows, :k] = _search_label(queries, base, srows, q, furthest=False, use_gpu=use_gpu)
        far[prows, :k] = _search_label(queries, base, srows, q, furthest=True, use_gpu=use_gpu)
    return near, far
