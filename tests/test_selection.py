"""Pools, PLM weights and quotas (post-processing of the noisy votes)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wasp_vllm.pipeline.selection import (
    allocate_quotas,
    plm_scores,
    plm_weights,
    select_pools,
    split_over_labels,
)

QUICK = settings(max_examples=60, deadline=None, database=None)

# --- pools ------------------------------------------------------------------------------------------


def test_pools_are_top_s_per_label_without_overlap():
    labels = np.array([0, 1, 0, 1, 0, 0, 0, 1])
    h_near = np.array([5.0, 9.0, 4.0, 1.0, 3.0, -1.0, -2.0, 0.0])
    h_far = np.array([-1.0, 0.0, -2.0, 1.0, 0.5, 6.0, 7.0, 2.0])
    pools = select_pools(h_near, h_far, labels, 2, 3)
    assert set(pools) == {0, 1, 2}
    np.testing.assert_array_equal(pools[0].good, [0, 2])
    np.testing.assert_array_equal(pools[0].bad, [6, 5])
    # label 1 has 3 < 2s rows: good drafts 1, bad drafts 7, good drafts 3 (second in both lists)
    np.testing.assert_array_equal(pools[1].good, [1, 3])
    np.testing.assert_array_equal(pools[1].bad, [7])
    assert pools[2].good.size == 0 and pools[2].bad.size == 0
    assert pools[0].good.dtype == np.int64 and pools[2].bad.dtype == np.int64


def test_overlap_goes_to_the_pool_where_it_ranks_better():
    labels = np.zeros(6, int)
    # row 0: rank 3 in near but rank 0 in far -> bad; row 1: rank 0 in near and rank 1 in far -> good
    h_near = np.array([6.0, 9.0, 8.0, 7.0, 0.0, 0.0])
    h_far = np.array([9.0, 8.0, 0.0, 0.0, 7.0, 1.0])
    pools = select_pools(h_near, h_far, labels, 3, 1)
    np.testing.assert_array_equal(pools[0].good, [1, 2, 3])
    np.testing.assert_array_equal(pools[0].bad, [0, 4, 5])


def test_ties_prefer_lower_rows():
    labels = np.zeros(6, int)
    pools = select_pools(np.zeros(6), np.zeros(6), labels, 2, 1)
    np.testing.assert_array_equal(pools[0].good, [0, 2])
    np.testing.assert_array_equal(pools[0].bad, [1, 3])


def test_small_labels_split_between_pools():
    pools = select_pools(np.array([1.0, 2.0, 3.0]), np.array([3.0, 2.0, 1.0]), np.zeros(3, int), 4, 1)
    np.testing.assert_array_equal(pools[0].good, [2, 1])
    np.testing.assert_array_equal(pools[0].bad, [0])


@QUICK
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(0, 60), n_labels=st.integers(1, 4), s=st.integers(0, 8))
def test_pool_properties(seed, n, n_labels, s):
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, n_labels, n)
    h_near, h_far = rng.normal(size=n).round(1), rng.normal(size=n).round(1)  # rounding makes ties
    pools = select_pools(h_near, h_far, labels, s, n_labels)
    again = select_pools(h_near.copy(), h_far.copy(), labels.copy(), s, n_labels)
    for label, pool in pools.items():
        rows = np.flatnonzero(labels == label)
        assert len(pool.good) <= s and len(pool.bad) <= s
        assert len(pool.good) + len(pool.bad) == min(2 * s, rows.size)
        assert not set(pool.good) & set(pool.bad)
        assert set(pool.good) | set(pool.bad) <= set(rows)
        np.testing.assert_array_equal(pool.good, again[label].good)
        np.testing.assert_array_equal(pool.bad, again[label].bad)
        # ranked best-first
        assert np.all(np.diff(h_near[pool.good]) <= 0) and np.all(np.diff(h_far[pool.bad]) <= 0)
        # with no overlap of the plain top-s lists, the pools are exactly those lists
        top_near = rows[np.lexsort((rows, -h_near[rows]))][:s]
        top_far = rows[np.lexsort((rows, -h_far[rows]))][:s]
        if not set(top_near) & set(top_far):
            np.testing.assert_array_equal(pool.good, top_near)
            np.testing.assert_array_equal(pool.bad, top_far)


@pytest.mark.parametrize(
    ("args", "match"),
    [
        ((np.zeros(3), np.zeros(3), np.array([0, 1, 2]), 1, 2), r"\[0, 2\)"),
        ((np.zeros(3), np.zeros(2), np.zeros(3, int), 1, 1), "length"),
        ((np.array([0, np.nan, 0]), np.zeros(3), np.zeros(3, int), 1, 1), "NaN"),
        ((np.zeros(3), np.zeros(3), np.zeros(3), 1, 1), "integer"),
        ((np.zeros(3), np.zeros(3), np.zeros(3, int), -1, 1), "s must"),
        ((np.zeros(3), np.zeros(3), np.zeros(3, int), 1, 0), "n_labels"),
    ],
)
def test_pool_validation(args, match):
    with pytest.raises(ValueError, match=match):
        select_pools(*args)


# --- PLM weights ------------------------------------------------------------------------------------


def test_weights_equal_the_paper_formula_for_positive_votes():
    rng = np.random.default_rng(0)
    plm = rng.integers(0, 3, 50)
    h = rng.uniform(0.0, 2.0, 50)
    s_i = h / h.sum()
    paper = np.array([s_i[plm == k].sum() / (np.sum(plm == k) / 50) for k in range(3)])
    np.testing.assert_allclose(plm_weights(h, plm, 3, np.ones(3) / 3), paper / paper.sum(), rtol=1e-12)
    np.testing.assert_allclose(plm_scores(h, plm, 3) / h.sum(), paper, rtol=1e-12)


def test_weights_normalise_by_plm_share():
    # PLM 0 made 3 samples with 3 votes, PLM 1 made 1 sample with 1 vote: equal quality per sample
    w = plm_weights(np.array([1.0, 1.0, 1.0, 1.0]), np.array([0, 0, 0, 1]), 2, np.array([0.5, 0.5]))
    np.testing.assert_allclose(w, [0.5, 0.5])


def test_negative_scores_are_clipped_and_empty_plm_gets_zero():
    h = np.array([2.0, 1.0, -5.0, -1.0, 0.5])
    plm = np.array([0, 0, 1, 1, 0])  # PLM 2 produced nothing
    w = plm_weights(h, plm, 3, np.ones(3) / 3)
    np.testing.assert_allclose(w, [1.0, 0.0, 0.0])


def test_all_non_positive_keeps_previous_weights():
    prev = np.array([0.2, 0.3, 0.5])
    w = plm_weights(np.array([-1.0, -2.0, 0.0]), np.array([0, 1, 2]), 3, prev)
    np.testing.assert_allclose(w, prev)
    assert w is not prev
    empty = plm_weights(np.zeros(0), np.zeros(0, int), 2, np.array([1.0, 3.0]))
    np.testing.assert_allclose(empty, [0.25, 0.75])


@QUICK
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(0, 80), k=st.integers(1, 5), scale=st.floats(0.01, 100))
def test_weight_properties(seed, n, k, scale):
    rng = np.random.default_rng(seed)
    plm = rng.integers(0, k, n)
    h = rng.normal(0.3, 1.0, n) * scale
    prev = rng.dirichlet(np.ones(k))
    w = plm_weights(h, plm, k, prev)
    assert w.shape == (k,) and np.all(np.isfinite(w)) and np.all(w >= 0)
    assert math.isclose(w.sum(), 1.0, rel_tol=1e-12)
    np.testing.assert_array_equal(w, plm_weights(h, plm, k, prev))
    missing = np.setdiff1d(np.arange(k), plm)
    if not np.allclose(w, prev):
        assert np.all(w[missing] == 0)


def test_weight_validation():
    with pytest.raises(ValueError):
        plm_weights(np.zeros(3), np.array([0, 1, 2]), 2, np.ones(2) / 2)  # PLM id out of range
    with pytest.raises(ValueError):
        plm_weights(np.zeros(3), np.array([0, 1, 1]), 2, np.array([-0.5, 1.5]))
    with pytest.raises(ValueError):
        plm_weights(np.zeros(3), np.array([0, 1, 1]), 2, np.ones(3) / 3)
    with pytest.raises(ValueError):
        plm_weights(np.array([0.0, np.inf, 1.0]), np.array([0, 1, 1]), 2, np.ones(2) / 2)


# --- quotas -----------------------------------------------------------------------------------------


def test_largest_remainder_examples():
    np.testing.assert_array_equal(allocate_quotas(10, np.array([1, 1, 1])), [4, 3, 3])
    np.testing.assert_array_equal(allocate_quotas(100, np.array([0.5, 0.3, 0.2])), [50, 30, 20])
    np.testing.assert_array_equal(allocate_quotas(7, np.array([0.1, 0.45, 0.45])), [1, 3, 3])
    np.testing.assert_array_equal(allocate_quotas(7, np.array([0.05, 0.5, 0.45])), [0, 4, 3])
    np.testing.assert_array_equal(allocate_quotas(0, np.array([0.3, 0.7])), [0, 0])


def test_floor_uses_water_filling():
    np.testing.assert_array_equal(allocate_quotas(100, np.array([0.9, 0.1]), floor=20), [80, 20])
    np.testing.assert_array_equal(allocate_quotas(100, np.array([0.98, 0.01, 0.01]), floor=10), [80, 10, 10])
    np.testing.assert_array_equal(allocate_quotas(9, np.array([1.0, 0.0, 0.0]), floor=3), [3, 3, 3])
    np.testing.assert_array_equal(allocate_quotas(10, np.array([0.0, 0.0, 1.0]), floor=2), [2, 2, 6])
    with pytest.raises(ValueError, match="floor"):
        allocate_quotas(5, np.array([0.5, 0.5]), floor=3)


@QUICK
@given(
    seed=st.integers(0, 2**32 - 1),
    total=st.integers(0, 10_000),
    k=st.integers(1, 8),
    floor=st.integers(0, 50),
)
def test_quota_properties(seed, total, k, floor):
    rng = np.random.default_rng(seed)
    w = rng.dirichlet(np.ones(k) * 0.5)
    if floor * k > total:
        with pytest.raises(ValueError):
            allocate_quotas(total, w, floor)
        return
    out = allocate_quotas(total, w, floor)
    assert out.dtype == np.int64 and out.sum() == total and np.all(out >= floor)
    np.testing.assert_array_equal(out, allocate_quotas(total, w.copy(), floor))
    if floor == 0:
        assert np.all(np.abs(out - total * w / w.sum()) < 1.0)


@pytest.mark.parametrize(
    "args",
    [
        (-1, np.ones(2)),
        (5, np.array([])),
        (5, np.array([-1.0, 2.0])),
        (5, np.zeros(2)),
        (5, np.array([np.nan, 1.0])),
        (5.5, np.ones(2)),
    ],
)
def test_quota_validation(args):
    with pytest.raises(ValueError):
        allocate_quotas(*args)


def test_split_over_labels():
    np.testing.assert_array_equal(split_over_labels(10, 3), [4, 3, 3])
    np.testing.assert_array_equal(split_over_labels(10, 3, offset=1), [3, 4, 3])
    np.testing.assert_array_equal(split_over_labels(2, 3, offset=2), [1, 0, 1])
    np.testing.assert_array_equal(split_over_labels(0, 4), [0, 0, 0, 0])
    # rotating the offset spreads repeated single samples over every label
    total = sum(split_over_labels(1, 4, offset=t) for t in range(8))
    np.testing.assert_array_equal(total, [2, 2, 2, 2])
    with pytest.raises(ValueError):
        split_over_labels(3, 0)
    with pytest.raises(ValueError):
        split_over_labels(-1, 2)


@QUICK
@given(n=st.integers(0, 5000), n_labels=st.integers(1, 20), offset=st.integers(-50, 50))
def test_split_properties(n, n_labels, offset):
    out = split_over_labels(n, n_labels, offset)
    assert out.dtype == np.int64 and out.sum() == n and out.max() - out.min() <= 1 and np.all(out >= 0)


def test_without_h_far_the_good_pool_is_the_plain_top_s_and_no_bad_pool():
    labels = np.array([0, 1, 0, 1, 0, 0, 0, 1])
    h_near = np.array([5.0, 9.0, 4.0, 1.0, 3.0, -1.0, 4.0, 0.0])
    pools = select_pools(h_near, None, labels, 3, 3)
    np.testing.assert_array_equal(pools[0].good, [0, 2, 6])  # the tie (4.0) to the lower row
    np.testing.assert_array_equal(pools[1].good, [1, 3, 7])
    assert pools[2].good.size == 0
    assert all(p.bad.size == 0 and p.bad.dtype == np.int64 for p in pools.values())


def test_only_eligible_samples_enter_the_good_pool_and_the_bad_pool_takes_any():
    labels = np.zeros(6, int)
    h_near = np.array([9.0, 8.0, 7.0, 6.0, 5.0, 4.0])
    h_far = np.array([0.0, 9.0, 0.0, 0.0, 0.0, 1.0])
    eligible = np.array([False, False, True, True, True, True])
    few_shot = select_pools(h_near, None, labels, 2, 1, eligible)
    np.testing.assert_array_equal(few_shot[0].good, [2, 3])  # rows 0 and 1 have the most votes
    contrastive = select_pools(h_near, h_far, labels, 2, 1, eligible)
    np.testing.assert_array_equal(contrastive[0].good, [2, 3])
    np.testing.assert_array_equal(contrastive[0].bad, [1, 5])  # row 1 is set aside from good only
    # no eligible sample: an empty good pool, the bad pool still fills
    none = select_pools(h_near, h_far, labels, 2, 1, np.zeros(6, bool))
    assert none[0].good.size == 0 and none[0].bad.tolist() == [1, 5]
    with pytest.raises(ValueError, match="eligible"):
        select_pools(h_near, None, labels, 2, 1, np.ones(5, bool))
