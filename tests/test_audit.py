"""Empirical privacy audit of the released votes: the real voting-plus-noise step, run many times
on D (with a canary record) and D' (without), must not be distinguishable beyond the claimed
epsilon; with the noise scaled down 4x the same audit must refute the claim."""

from __future__ import annotations

import numpy as np
import pytest

from wasp_vllm.privacy.audit import clopper_pearson, epsilon_lower_bound
from wasp_vllm.privacy.plan import plan_privacy
from wasp_vllm.privacy.voting import clean_histograms, noisy_votes

EPSILON, DELTA, Q, TRIALS = 4.0, 1e-5, 4, 6000


def test_clopper_pearson_known_values():
    lo, hi = clopper_pearson(0, 100, 0.05)
    assert lo == 0.0 and hi == pytest.approx(0.0362, abs=1e-4)  # the "rule of three" region
    lo, hi = clopper_pearson(50, 100, 0.05)
    assert lo == pytest.approx(0.3983, abs=1e-4) and hi == pytest.approx(0.6017, abs=1e-4)
    with pytest.raises(ValueError):
        clopper_pearson(5, 3, 0.05)


def _audit(noise_scale: float) -> float:
    rng = np.random.default_rng(0)
    private = rng.normal(size=(10, 8)).astype(np.float32)
    labels = np.arange(10) % 2
    canary = rng.normal(size=(1, 8)).astype(np.float32) * 3  # an outlier: its votes stand out
    synth, synth_labels = rng.normal(size=(40, 8)).astype(np.float32), np.arange(40) % 2
    with_canary = (np.vstack([private, canary]), np.append(labels, 0))
    without = (private, labels)
    sigma = plan_privacy(EPSILON, DELTA, rounds=2, q=Q).sigma * noise_scale
    v = np.concatenate(clean_histograms(*with_canary, synth, synth_labels, Q)) - np.concatenate(
        clean_histograms(*without, synth, synth_labels, Q)
    )  # the canary's own vote vector: the likelihood-ratio direction

    def scores(data: tuple[np.ndarray, np.ndarray], stream: int) -> np.ndarray:
        noise = np.random.default_rng([7, stream])
        out = np.empty(TRIALS)
        for i in range(TRIALS):
            votes = noisy_votes(*data, synth, synth_labels, Q, sigma, noise)
            out[i] = np.concatenate([votes.h_near, votes.h_far]) @ v
        return out

    return epsilon_lower_bound(scores(with_canary, 1), scores(without, 2), DELTA).epsilon_lower_bound


def test_the_released_votes_are_no_more_distinguishable_than_claimed():
    assert _audit(1.0) < EPSILON


def test_the_audit_catches_a_quarter_of_the_noise():
    assert _audit(0.25) > EPSILON
