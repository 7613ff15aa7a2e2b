"""Distribution metrics between synthetic and private text, computed on sentence embeddings.

The paper judges how close the synthetic set is to the private one by the Fréchet
distance between Gaussians fitted to the two embedding sets ("FID", as in image
generation) and shows it falling over the rounds.  The private sets here are small
(tens to hundreds of records) and the embeddings have 384-768 dimensions, so the
fitted covariances are usually singular; the square root below is therefore guarded
the way the common FID code guards it (eps*I on the diagonals, imaginary part dropped).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import numpy as np
from scipy import linalg

from wasp_vllm.evaluation.common import EvaluationError, to_label_indices

log = logging.getLogger(__name__)

# Relative Frobenius error of sqrtm above which the product is treated as singular and retried
# with eps*I added to both covariances.  pytorch-fid only retries on non-finite output; with
# n < d the Schur square root is finite but can be badly wrong, so the residual is checked too.
_SQRTM_REL_TOL = 1e-3


class MetricError(EvaluationError):
    """Inputs for which a distribution metric is undefined (too few samples, shape mismatch)."""


def _moments(emb: np.ndarray, name: str) -> tuple[np.ndarray, np.ndarray]:
    """Mean and (unbiased) covariance of an [n, d] embedding array, in float64 for a stable sqrtm."""
    x = np.asarray(emb, dtype=np.float64)
    if x.ndim != 2:
        raise MetricError(f"{name} must be a 2-D [n, d] array, got shape {x.shape}")
    if x.shape[0] < 2:
        raise MetricError(f"{name} needs at least 2 embeddings to fit a covariance, got {x.shape[0]}")
    if not np.isfinite(x).all():
        raise MetricError(f"{name} contains NaN or infinite values")
    return x.mean(axis=0), np.atleast_2d(np.cov(x, rowvar=False))


def _sqrtm_rel_error(root: np.ndarray, product: np.ndarray) -> float:
    """||root @ root - product||_F / ||product||_F: scipy's former error estimate, now computed here."""
    denom = float(np.linalg.norm(product, "fro")) or 1.0
    return float(np.linalg.norm(root @ root - product, "fro")) / denom


def _trace_sqrt_product(sigma1: np.ndarray, sigma2: np.ndarray, eps: float) -> float:
    """tr(sqrt(sigma1 @ sigma2)), retrying with eps*I when the product is (numerically) singular."""
    product = sigma1 @ sigma2
    root = linalg.sqrtm(product)
    if not np.isfinite(root).all() or _sqrtm_rel_error(root, product) > _SQRTM_REL_TOL:
        log.debug("covariance product is singular; adding %g*I before sqrtm", eps)
        offset = np.eye(sigma1.shape[0]) * eps
        product = (sigma1 + offset) @ (sigma2 + offset)
        root = linalg.sqrtm(product)
    if np.iscomplexobj(root):
        max_imag = float(np.max(np.abs(np.diagonal(root).imag)))
        if max_imag > 1e-3:
            log.debug("dropping imaginary part of sqrtm (largest on diagonal: %.3g)", max_imag)
        root = root.real
    return float(np.trace(root))


def _trace_sqrt_product_eigh(sigma1: np.ndarray, sigma2: np.ndarray) -> float:
    """tr(sqrt(sigma1 @ sigma2)) via symmetric eigendecompositions: exact for PSD inputs, and fast.

    sigma1 @ sigma2 is similar to sqrt(sigma1) sigma2 sqrt(sigma1), which is symmetric PSD, so the
    trace of the square root is the sum of the square roots of its eigenvalues (clipped at 0).
    """
    evals, evecs = np.linalg.eigh(sigma1)
    root1 = (evecs * np.sqrt(np.clip(evals, 0.0, None))) @ evecs.T
    inner = np.linalg.eigvalsh(root1 @ sigma2 @ root1)
    return float(np.sqrt(np.clip(inner, 0.0, None)).sum())


FID_METHODS = ("sqrtm", "eigh")


def frechet_distance(
    mu1: np.ndarray,
    sigma1: np.ndarray,
    mu2: np.ndarray,
    sigma2: np.ndarray,
    eps: float = 1e-6,
    method: str = "sqrtm",
) -> float:
    """Fréchet (2-Wasserstein squared) distance between N(mu1, sigma1) and N(mu2, sigma2).

    ||mu1 - mu2||^2 + tr(sigma1 + sigma2 - 2 sqrt(sigma1 sigma2)); clipped at 0 because
    rounding can make the exact 0 of identical inputs slightly negative.  ``method="sqrtm"``
    is the common FID code's computation (so numbers compare with published ones);
    ``"eigh"`` gives the same value several times faster at 768 dimensions.
    """
    if method not in FID_METHODS:
        raise MetricError(f"unknown FID method {method!r}; choose one of {', '.join(FID_METHODS)}")
    mu1, mu2 = np.atleast_1d(mu1).astype(np.float64), np.atleast_1d(mu2).astype(np.float64)
    sigma1, sigma2 = np.atleast_2d(sigma1).astype(np.float64), np.atleast_2d(sigma2).astype(np.float64)
    if mu1.shape != mu2.shape or sigma1.shape != sigma2.shape or sigma1.shape != (mu1.size, mu1.size):
        raise MetricError(
            f"shape mismatch: means {mu1.shape} and {mu2.shape}, "
            f"covariances {sigma1.shape} and {sigma2.shape}"
        )
    diff = mu1 - mu2
    value = float(diff @ diff) + float(np.trace(sigma1) + np.trace(sigma2))
    if method == "eigh":
        value -= 2.0 * _trace_sqrt_product_eigh(sigma1, sigma2)
    else:
        value -= 2.0 * _trace_sqrt_product(sigma1, sigma2, eps)
    return max(value, 0.0)


def fid(emb_a: np.ndarray, emb_b: np.ndarray, eps: float = 1e-6, method: str = "sqrtm") -> float:
    """Fréchet distance between Gaussians fitted to two embedding sets ([n_a, d] and [n_b, d]).

    Works for n < d (singular covariances) thanks to the eps*I retry; needs n >= 2 per set.
    See ``frechet_distance`` for ``method``.
    """
    mu_a, sigma_a = _moments(emb_a, "emb_a")
    mu_b, sigma_b = _moments(emb_b, "emb_b")
    if mu_a.shape != mu_b.shape:
        raise MetricError(f"embedding dimensions differ: {mu_a.size} vs {mu_b.size}")
    return frechet_distance(mu_a, sigma_a, mu_b, sigma_b, eps=eps, method=method)


def fid_per_round(
    synth_emb: np.ndarray,
    synth_round: np.ndarray | Sequence[int],
    private_emb: np.ndarray,
    method: str = "sqrtm",
) -> dict[int, float]:
    """FID of the synthetic set accumulated up to each round against the private set.

    WASP keeps everything it generated (D grows every round), so the paper's FID-over-rounds
    curve is cumulative: the value at round t uses all samples with round <= t.  FID is biased
    upward for small samples, so part of any fall over rounds comes from the growing set alone;
    compare methods at equal sizes rather than reading the curve's slope on its own.
    """
    emb = np.asarray(synth_emb)
    rounds = np.asarray(synth_round).reshape(-1)
    if emb.ndim != 2 or rounds.shape[0] != emb.shape[0]:
        raise MetricError(f"synth_round has {rounds.shape[0]} entries but synth_emb has shape {emb.shape}")
    return {int(t): fid(emb[rounds <= t], private_emb, method=method) for t in np.unique(rounds)}


def label_balance(
    labels: np.ndarray | Sequence[int] | Sequence[str], label_names: Sequence[str]
) -> dict[str, int]:
    """Count of records per label name, zeros included, so a collapsed generator is visible.

    ``labels`` may be indices into ``label_names`` or the names themselves.
    """
    idx = to_label_indices(labels, label_names, what="labels")
    counts = np.bincount(idx, minlength=len(label_names))
    return {name: int(c) for name, c in zip(label_names, counts, strict=True)}
