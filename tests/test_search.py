"""Exactness of the per-label Top-q search against a float64 brute force."""

from __future__ import annotations

import numpy as np
import pytest

from wasp_vllm.privacy import search
from wasp_vllm.privacy.search import topq_near_far


def brute_force(p, pl, s, sl, q):
    """Reference: float64 distances, nearest-first / furthest-first, ties by lower row index."""
    m = len(p)
    near = np.full((m, q), -1, dtype=np.int64)
    far = np.full((m, q), -1, dtype=np.int64)
    p64, s64 = np.asarray(p, np.float64), np.asarray(s, np.float64)
    for j in range(m):
        rows = np.flatnonzero(sl == pl[j])
        if rows.size == 0:
            continue
        d = ((s64[rows] - p64[j]) ** 2).sum(axis=1)
        k = min(q, rows.size)
        near[j, :k] = rows[np.lexsort((rows, d))[:k]]
        far[j, :k] = rows[np.lexsort((rows, -d))[:k]]
    return near, far


def random_case(rng, m, n, d, n_labels, offset=0.0, dtype=np.float32):
    p = (rng.normal(size=(m, d)) + offset).astype(dtype)
    s = (rng.normal(size=(n, d)) + offset).astype(dtype)
    return p, rng.integers(0, n_labels, m), s, rng.integers(0, n_labels, n)


@pytest.mark.parametrize(
    ("m", "n", "d", "n_labels", "q"),
    [
        (1, 1, 1, 1, 1),
        (7, 50, 3, 2, 4),
        (30, 200, 16, 3, 8),
        (25, 120, 32, 5, 30),
        (40, 400, 8, 1, 8),
        (12, 9, 5, 4, 3),
        (20, 600, 64, 2, 2),
    ],
)
def test_matches_brute_force(m, n, d, n_labels, q):
    rng = np.random.default_rng(m * 1000 + n)
    p, pl, s, sl = random_case(rng, m, n, d, n_labels)
    near, far = topq_near_far(p, pl, s, sl, q, use_gpu=False)
    ref_near, ref_far = brute_force(p, pl, s, sl, q)
    assert near.shape == far.shape == (m, q)
    assert near.dtype == far.dtype == np.int64
    np.testing.assert_array_equal(near, ref_near)
    np.testing.assert_array_equal(far, ref_far)


def test_many_random_shapes_and_float64_input():
    rng = np.random.default_rng(7)
    for _ in range(12):
        m, n, d = int(rng.integers(0, 20)), int(rng.integers(0, 150)), int(rng.integers(1, 24))
        n_labels, q = int(rng.integers(1, 6)), int(rng.integers(1, 12))
        p, pl, s, sl = random_case(rng, m, n, d, n_labels, dtype=np.float64)
        got = topq_near_far(p, pl, s, sl, q)
        ref = brute_force(p, pl, s, sl, q)
        np.testing.assert_array_equal(got[0], ref[0])
        np.testing.assert_array_equal(got[1], ref[1])


def test_far_offset_data_has_no_float32_cancellation():
    """Points 1e3 away from the origin with unit spread: |x|^2 dwarfs the distances."""
    rng = np.random.default_rng(3)
    p, pl, s, sl = random_case(rng, 20, 300, 24, 2, offset=1000.0, dtype=np.float64)
    near, far = topq_near_far(p, pl, s, sl, 8)
    ref_near, ref_far = brute_force(p, pl, s, sl, 8)
    np.testing.assert_array_equal(near, ref_near)
    np.testing.assert_array_equal(far, ref_far)


def test_ties_go_to_lower_row_index():
    # Synthetic rows 0..5 of label 0: rows 1, 3, 5 coincide (nearest), rows 0, 2, 4 coincide (furthest).
    s = np.array([[10.0], [1.0], [10.0], [1.0], [10.0], [1.0], [5.0]], dtype=np.float32)
    sl = np.array([0, 0, 0, 0, 0, 0, 1])
    p = np.array([[0.0]], dtype=np.float32)
    near, far = topq_near_far(p, np.array([0]), s, sl, 4)
    np.testing.assert_array_equal(near, [[1, 3, 5, 0]])
    np.testing.assert_array_equal(far, [[0, 2, 4, 1]])


def test_all_identical_points_fall_back_to_exact_order():
    s = np.ones((100, 4), dtype=np.float32)
    p = np.ones((3, 4), dtype=np.float32)
    near, far = topq_near_far(p, np.zeros(3, int), s, np.zeros(100, int), 5)
    np.testing.assert_array_equal(near, np.tile(np.arange(5), (3, 1)))
    np.testing.assert_array_equal(far, np.tile(np.arange(5), (3, 1)))


def test_padding_and_empty_labels():
    rng = np.random.default_rng(0)
    s = rng.normal(size=(5, 3)).astype(np.float32)
    sl = np.array([0, 0, 0, 2, 2])  # label 1 has no synthetic sample, label 2 has two
    p = rng.normal(size=(3, 3)).astype(np.float32)
    pl = np.array([1, 2, 0])
    near, far = topq_near_far(p, pl, s, sl, 4)
    assert (near[0] == -1).all() and (far[0] == -1).all()
    assert set(near[1, :2]) == {3, 4} and (near[1, 2:] == -1).all()
    assert set(far[2, :3]) == {0, 1, 2} and far[2, 3] == -1


def test_empty_inputs():
    near, far = topq_near_far(
        np.zeros((0, 4), np.float32), np.zeros(0, int), np.ones((6, 4), np.float32), np.zeros(6, int), 3
    )
    assert near.shape == far.shape == (0, 3)
    near, far = topq_near_far(
        np.ones((2, 4), np.float32), np.zeros(2, int), np.zeros((0, 4), np.float32), np.zeros(0, int), 3
    )
    assert (near == -1).all() and (far == -1).all() and near.shape == (2, 3)


def test_candidate_path_is_used_on_separated_data(monkeypatch):
    """On generic data the FAISS candidates must certify; the brute-force fallback stays unused."""

    def boom(*args, **kwargs):
        raise AssertionError("fallback used")

    monkeypatch.setattr(search, "_brute_row", boom)
    rng = np.random.default_rng(11)
    p, pl, s, sl = random_case(rng, 10, 500, 8, 1)
    near, far = topq_near_far(p, pl, s, sl, 4)
    ref = brute_force(p, pl, s, sl, 4)
    np.testing.assert_array_equal(near, ref[0])
    np.testing.assert_array_equal(far, ref[1])


def test_fallback_path_is_exact(monkeypatch):
    """With an absurd error bound every row is recomputed by brute force, with the same result."""
    monkeypatch.setattr(search, "_U32", 1.0)
    rng = np.random.default_rng(12)
    p, pl, s, sl = random_case(rng, 15, 300, 6, 3)
    near, far = topq_near_far(p, pl, s, sl, 5)
    ref = brute_force(p, pl, s, sl, 5)
    np.testing.assert_array_equal(near, ref[0])
    np.testing.assert_array_equal(far, ref[1])


@pytest.mark.parametrize(
    ("args", "match"),
    [
        ((np.zeros((2, 3)), np.zeros(2, int), np.zeros((4, 3)), np.zeros(4, int), 0), "q must"),
        ((np.zeros((2, 3)), np.zeros(2, int), np.zeros((4, 3)), np.zeros(4, int), True), "q must"),
        ((np.zeros((2, 3)), np.zeros(2, int), np.zeros((4, 2)), np.zeros(4, int), 1), "dims differ"),
        ((np.zeros(3), np.zeros(1, int), np.zeros((4, 3)), np.zeros(4, int), 1), "2-D"),
        ((np.zeros((2, 3), int), np.zeros(2, int), np.zeros((4, 3)), np.zeros(4, int), 1), "floating"),
        ((np.zeros((2, 3)), np.zeros(2), np.zeros((4, 3)), np.zeros(4, int), 1), "integer"),
        ((np.zeros((2, 3)), np.zeros(3, int), np.zeros((4, 3)), np.zeros(4, int), 1), "length 2"),
        ((np.full((2, 3), np.nan), np.zeros(2, int), np.zeros((4, 3)), np.zeros(4, int), 1), "NaN"),
    ],
)
def test_validation(args, match):
    with pytest.raises(ValueError, match=match):
        topq_near_far(*args)


def test_gpu_probe_is_false_without_gpu():
    faiss = pytest.importorskip("faiss")
    assert search.gpu_available() == (faiss.get_num_gpus() > 0)


def test_values_beyond_float32_range_stay_exact():
    rng = np.random.default_rng(13)
    p, pl, s, sl = random_case(rng, 4, 80, 3, 1, dtype=np.float64)
    p, s = p * 1e30, s * 1e30  # float32 overflows to inf; the float64 rescoring must take over
    near, far = topq_near_far(p, pl, s, sl, 3)
    ref = brute_force(p, pl, s, sl, 3)
    np.testing.assert_array_equal(near, ref[0])
    np.testing.assert_array_equal(far, ref[1])
