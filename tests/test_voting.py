"""Vote histograms, their L2 sensitivity, and the Gaussian noise step."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from wasp_vllm.privacy.accountant import wasp_sensitivity
from wasp_vllm.privacy.search import topq_near_far
from wasp_vllm.privacy.voting import (
    NoisyVotes,
    add_noise,
    clean_histograms,
    histogram_from_indices,
    noisy_votes,
    vote_weights,
)


def test_vote_weights():
    np.testing.assert_allclose(vote_weights(1), [1.0])
    np.testing.assert_allclose(vote_weights(4), [1.0, 0.5, 0.25, 0.125])
    w = vote_weights(8)
    assert math.isclose(float(w @ w), 4.0 / 3.0 * (1 - 4.0**-8), rel_tol=1e-12)
    for bad in (0, -1, 2.0, True):
        with pytest.raises(ValueError):
            vote_weights(bad)


def test_histogram_from_indices_skips_padding():
    idx = np.array([[2, 0, -1], [2, -1, -1]])
    np.testing.assert_allclose(histogram_from_indices(idx, 4), [0.5, 0.0, 2.0, 0.0])
    with pytest.raises(ValueError):
        histogram_from_indices(np.array([[5]]), 4)


def test_clean_histograms_match_the_indices():
    rng = np.random.default_rng(0)
    p, s = rng.normal(size=(12, 5)), rng.normal(size=(40, 5))
    pl, sl = rng.integers(0, 3, 12), rng.integers(0, 3, 40)
    h_near, h_far = clean_histograms(p, pl, s, sl, 4)
    near, far = topq_near_far(p, pl, s, sl, 4)
    w = vote_weights(4)
    exp_near, exp_far = np.zeros(40), np.zeros(40)
    for j in range(12):
        for r in range(4):
            if near[j, r] >= 0:
                exp_near[near[j, r]] += w[r]
                exp_far[far[j, r]] += w[r]
    np.testing.assert_allclose(h_near, exp_near)
    np.testing.assert_allclose(h_far, exp_far)
    assert h_near.dtype == h_far.dtype == np.float64
    # every private sample whose label pool holds >= q samples hands out exactly sum(w) per histogram
    full = sum(1 for j in range(12) if np.sum(sl == pl[j]) >= 4)
    assert h_near.sum() >= full * w.sum() - 1e-12


def _vector(p, pl, s, sl, q):
    return np.concatenate(clean_histograms(p, pl, s, sl, q))


@settings(max_examples=25, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**32 - 1),
    q=st.integers(1, 6),
    n_labels=st.integers(1, 3),
    n=st.integers(1, 40),
    m=st.integers(1, 10),
)
def test_add_remove_replace_within_sensitivity(seed, q, n_labels, n, m):
    rng = np.random.default_rng(seed)
    p, s = rng.normal(size=(m, 3)), rng.normal(size=(n, 3))
    pl, sl = rng.integers(0, n_labels, m), rng.integers(0, n_labels, n)
    base = _vector(p, pl, s, sl, q)
    bound = wasp_sensitivity(q)
    # add one record
    x, xl = rng.normal(size=(1, 3)), rng.integers(0, n_labels, 1)
    added = _vector(np.vstack([p, x]), np.concatenate([pl, xl]), s, sl, q)
    assert np.linalg.norm(added - base) <= bound + 1e-12
    if np.sum(sl == xl[0]) >= q:  # a full pool: the bound is attained
        assert math.isclose(np.linalg.norm(added - base), bound, rel_tol=1e-9)
    # remove one record
    j = int(rng.integers(0, m))
    removed = _vector(np.delete(p, j, 0), np.delete(pl, j), s, sl, q)
    assert np.linalg.norm(removed - base) <= bound + 1e-12
    # replace one record
    replaced_p, replaced_l = p.copy(), pl.copy()
    replaced_p[j], replaced_l[j] = x[0], xl[0]
    replaced = _vector(replaced_p, replaced_l, s, sl, q)
    assert np.linalg.norm(replaced - base) <= wasp_sensitivity(q, "replace") + 1e-12


def test_replace_bound_is_attained_across_labels():
    rng = np.random.default_rng(5)
    q = 5
    s, sl = rng.normal(size=(30, 4)), np.repeat([0, 1], 15)
    p, pl = rng.normal(size=(6, 4)), np.array([0, 0, 1, 1, 0, 1])
    base = _vector(p, pl, s, sl, q)
    p2, pl2 = p.copy(), pl.copy()
    p2[0], pl2[0] = rng.normal(size=4), 1  # a label-0 record becomes a label-1 record
    moved = np.linalg.norm(_vector(p2, pl2, s, sl, q) - base)
    assert math.isclose(moved, wasp_sensitivity(q, "replace"), rel_tol=1e-9)


def test_user_level_bound_is_attained_by_duplicated_records():
    rng = np.random.default_rng(6)
    q, r = 3, 4
    s, sl = rng.normal(size=(20, 2)), np.zeros(20, int)
    p, pl = rng.normal(size=(3, 2)), np.zeros(3, int)
    base = _vector(p, pl, s, sl, q)
    x = rng.normal(size=(1, 2))
    grown = _vector(np.vstack([p] + [x] * r), np.zeros(3 + r, int), s, sl, q)
    assert math.isclose(np.linalg.norm(grown - base), wasp_sensitivity(q, records_per_unit=r), rel_tol=1e-9)


def test_add_noise_is_seeded_and_gaussian():
    h = np.zeros(20000)
    a = add_noise(h, h, 2.5, np.random.default_rng(42))
    b = add_noise(h, h, 2.5, np.random.default_rng(42))
    c = add_noise(h, h, 2.5, np.random.default_rng(43))
    assert isinstance(a, NoisyVotes) and a.sigma == 2.5
    np.testing.assert_array_equal(a.h_near, b.h_near)
    np.testing.assert_array_equal(a.h_far, b.h_far)
    assert not np.array_equal(a.h_near, c.h_near)
    assert not np.array_equal(a.h_near, a.h_far)  # independent noise per histogram
    for x in (a.h_near, a.h_far):
        assert abs(x.mean()) < 0.1  # 5 standard errors
        assert abs(x.std() - 2.5) < 0.07
    np.testing.assert_array_equal(h, 0.0)  # inputs untouched


@pytest.mark.parametrize("sigma", [0.0, -1.0, math.inf, math.nan])
def test_add_noise_rejects_bad_sigma(sigma):
    with pytest.raises(ValueError):
        add_noise(np.zeros(3), np.zeros(3), sigma, np.random.default_rng(0))


def test_add_noise_rejects_bad_inputs():
    with pytest.raises(ValueError):
        add_noise(np.zeros(3), np.zeros(4), 1.0, np.random.default_rng(0))
    with pytest.raises(ValueError):
        add_noise(np.zeros(3), np.zeros(3), 1.0, 0)


def test_noisy_votes_is_clean_plus_noise():
    rng = np.random.default_rng(1)
    p, s = rng.normal(size=(8, 4)), rng.normal(size=(30, 4))
    pl, sl = rng.integers(0, 2, 8), rng.integers(0, 2, 30)
    votes = noisy_votes(p, pl, s, sl, 3, 0.7, np.random.default_rng(9))
    h_near, h_far = clean_histograms(p, pl, s, sl, 3)
    expected = add_noise(h_near, h_far, 0.7, np.random.default_rng(9), q=3)
    np.testing.assert_array_equal(votes.h_near, expected.h_near)
    np.testing.assert_array_equal(votes.h_far, expected.h_far)
    assert votes.q == 3 and votes.sigma == 0.7


def test_the_private_voters_never_print_their_embeddings():
    """A traceback or a debug log that shows the voters must not show the private records' vectors."""
    from wasp_vllm.privacy.mechanisms import Voters

    voters = Voters(np.full((2, 3), 0.123456), np.array([0, 1]))
    assert "0.123" not in repr(voters) and "0.123" not in str(voters) and "Voters" in repr(voters)


def test_h_near_alone_takes_the_same_draws_and_half_the_squared_sensitivity():
    """``far=False`` releases ``H_near`` alone: the noise on it is the draw it gets beside ``H_far``
    (so a paired run isolates the smaller sigma), and the sensitivity is the two-histogram one over
    sqrt 2, attained by one record's vote."""
    h = np.arange(50.0)
    both = add_noise(h, -h, 1.5, np.random.default_rng(7))
    alone = add_noise(h, None, 1.5, np.random.default_rng(7))
    assert alone.h_far is None
    np.testing.assert_array_equal(alone.h_near, both.h_near)
    for q in (1, 3, 8):
        one, two = wasp_sensitivity(q, histograms=1), wasp_sensitivity(q)
        assert one == pytest.approx(two / math.sqrt(2), rel=1e-12)
        assert one == pytest.approx(np.linalg.norm(vote_weights(q)), rel=1e-12)  # one record's H_near
    for bad in (0, 3, True):
        with pytest.raises(ValueError, match="histograms"):
            wasp_sensitivity(8, histograms=bad)
