"""Votes on clusters of synthetic samples (``--vote-cluster-size``): the clusters, what a sample
carries, the sensitivity the plan pays for, and the signal a cluster gathers under the same noise.

The loop test's generation comes from ``FakeEngineForUnitTests`` and embeddings from
``HashEmbedderForTests`` (named as such): its subject is the loop's wiring of the votes.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.test_noise import config, run, write_private
from wasp_vllm.config import RunConfig
from wasp_vllm.pipeline.clusters import TIE_BREAK, capped_per_cluster, cluster_samples, votes_per_sample
from wasp_vllm.pipeline.selection import select_pools
from wasp_vllm.pipeline.store import RunStore
from wasp_vllm.privacy.accountant import wasp_sensitivity
from wasp_vllm.privacy.voting import NoisyVotes, clean_histograms, noisy_votes


def _unit(rng: np.random.Generator, n: int, d: int = 16) -> np.ndarray:
    x = rng.normal(size=(n, d))
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def test_clusters_stay_inside_their_label_and_come_in_the_size_asked():
    rng = np.random.default_rng(0)
    labels = np.array([0] * 20 + [1] * 7 + [2] * 1)
    clusters = cluster_samples(_unit(rng, labels.size), labels, size=8, seed=3)
    assert clusters.labels.tolist() == [0, 0, 0, 1, 2]  # ceil(20 / 8), ceil(7 / 8), ceil(1 / 8)
    assert clusters.centres.shape == (5, 16)
    assert (clusters.labels[clusters.members] == labels).all()
    for k in range(5):  # ranks 0, 1, ... from the centre inside each cluster
        inside = np.flatnonzero(clusters.members == k)
        assert sorted(clusters.centrality[inside].tolist()) == list(range(inside.size))
    again = cluster_samples(_unit(np.random.default_rng(0), labels.size), labels, size=8, seed=3)
    assert (again.members == clusters.members).all()  # the public seed fixes them
    with pytest.raises(ValueError, match="size must be >= 1, got 0"):
        cluster_samples(_unit(rng, 3), np.zeros(3), size=0, seed=0)


def test_a_sample_carries_its_clusters_noisy_vote_the_central_first():
    rng = np.random.default_rng(1)
    labels = np.array([0] * 12 + [1] * 6)
    clusters = cluster_samples(_unit(rng, labels.size), labels, size=4, seed=0)
    k = clusters.centres.shape[0]
    votes = NoisyVotes(h_near=np.arange(k, dtype=float), h_far=-np.arange(k, dtype=float), sigma=1.0, q=2)
    each = votes_per_sample(votes, clusters)
    offset = TIE_BREAK * clusters.centrality
    assert each.h_near == pytest.approx(clusters.members - offset)
    assert each.h_far == pytest.approx(-clusters.members - offset)
    best = np.flatnonzero(clusters.members == k - 1)
    assert np.argmax(each.h_near) == best[clusters.centrality[best] == 0][0]
    with pytest.raises(ValueError, match="votes for"):
        votes_per_sample(NoisyVotes(np.zeros(k + 1), None, 1.0, 2), clusters)


@pytest.mark.parametrize("q", [1, 3, 8])
def test_one_record_moves_the_votes_on_centres_by_no_more_than_the_planned_sensitivity(q):
    rng = np.random.default_rng(q)
    synth_labels = np.array([0] * 30 + [1] * 9)
    clusters = cluster_samples(_unit(rng, synth_labels.size), synth_labels, size=8, seed=0)
    private, private_labels = _unit(rng, 25), rng.integers(0, 2, size=25)
    whole = np.concatenate(clean_histograms(private, private_labels, clusters.centres, clusters.labels, q))
    for i in range(25):
        keep = np.arange(25) != i
        less = clean_histograms(private[keep], private_labels[keep], clusters.centres, clusters.labels, q)
        moved = np.linalg.norm(whole - np.concatenate(less))
        assert moved <= wasp_sensitivity(q, "add_remove") + 1e-12


def _hits(cluster_size: int, seeds: int = 40) -> float:
    """Share of the good pool drawn from the region the private records sit in, over noise draws.

    One label, 80 samples: 16 near the private records, 64 in four groups away from them; 33
    records (a label's share of M = 100); sigma 5, the WASP runs' sigma at epsilon 4."""
    rng = np.random.default_rng(7)
    centres = _unit(rng, 5)
    synth = np.concatenate([c + 0.05 * rng.normal(size=(16, 16)) for c in centres]).astype(np.float32)
    private = (centres[0] + 0.05 * rng.normal(size=(33, 16))).astype(np.float32)
    labels, private_labels = np.zeros(80, dtype=np.int64), np.zeros(33, dtype=np.int64)
    clusters = cluster_samples(synth, labels, cluster_size, seed=0) if cluster_size else None
    hits = []
    for seed in range(seeds):
        noise = np.random.default_rng(seed)
        if clusters is not None:
            votes = noisy_votes(private, private_labels, clusters.centres, clusters.labels, 8, 5.0, noise)
            votes = votes_per_sample(votes, clusters)
        else:
            votes = noisy_votes(private, private_labels, synth, labels, 8, 5.0, noise)
        good = select_pools(votes.h_near, votes.h_far, labels, 8, 1)[0].good
        hits.append(np.mean(good < 16))
    return float(np.mean(hits))


def test_a_cluster_gathers_votes_that_single_samples_lose_in_the_noise():
    single, clustered = _hits(0), _hits(8)
    assert clustered > 0.9 and clustered > single + 0.3, (single, clustered)


def _vote_groups(h_near: np.ndarray) -> np.ndarray:
    """Each sample's cluster as its vote shows it: the tie-break moves a cluster's samples apart by
    under 1e-5 and the noise (sigma about 1 or more) its clusters by far more than 1e-4. (Rounding
    would split a cluster that straddles a rounding boundary.)"""
    order = np.argsort(h_near, kind="stable")
    groups = np.empty(h_near.size, dtype=np.int64)
    groups[order] = np.concatenate([[0], np.cumsum(np.diff(h_near[order]) > 1e-4)])
    return groups


def test_the_loop_votes_on_clusters_and_writes_each_samples_cluster_vote(tmp_path):
    cfg = config(write_private(tmp_path / "p.csv"), vote_cluster_size=6)
    manifest = run(cfg, tmp_path / "out")
    assert manifest["config"]["vote_cluster_size"] == 6
    store = RunStore(tmp_path / "out")
    for t in range(cfg.rounds - 1):
        h_near = pq.read_table(store.votes_path(t)).column("h_near").to_numpy()
        distinct = np.unique(_vote_groups(h_near)).size  # one noisy value per cluster, about 6 samples each
        assert distinct <= np.ceil(h_near.size / 6) + 3 and distinct < h_near.size / 3
    with pytest.raises(ValueError, match="vote_cluster_size: only for methods that vote"):
        RunConfig(strategy="fusegen", vote_cluster_size=8)


def test_a_cap_keeps_each_clusters_best_voted_samples():
    members = np.array([0, 0, 0, 1, 1, 2, 0])
    h_near = np.array([5.0, 7.0, 6.0, 1.0, 1.0, 3.0, 7.0])
    assert capped_per_cluster(h_near, members, 2).tolist() == [False, True, False, True, True, True, True]
    assert capped_per_cluster(h_near, members, 1).tolist() == [False, True, False, True, False, True, False]
    assert capped_per_cluster(h_near, members, 9).all()
    with pytest.raises(ValueError, match="cap must be >= 1, got 0"):
        capped_per_cluster(h_near, members, 0)
    with pytest.raises(ValueError, match="one vote per sample"):
        capped_per_cluster(h_near[:3], members, 1)


def _pool_clusters(out) -> list[list[int]]:
    """Per label, the vote clusters the final good pool's samples come from (the pool the votes of
    round 1 chose, over the samples of rounds 0 and 1)."""
    store = RunStore(out)
    samples = pa.concat_tables([store.read_round(t) for t in range(2)])
    votes = pq.read_table(store.votes_path(1))
    assert votes.column("id").to_pylist() == samples.column("id").to_pylist()
    groups = _vote_groups(votes.column("h_near").to_numpy())
    group_of = dict(zip(samples.column("text").to_pylist(), groups, strict=True))
    state = store.load_state()
    assert state is not None
    return [[int(group_of[text]) for text in pool] for pool in state.pools.good.values()]


def test_a_capped_pool_takes_at_most_the_cap_from_a_cluster_and_spreads_over_more(tmp_path):
    private = write_private(tmp_path / "p.csv")
    spread = {}
    for cap in (0, 2):  # 20 samples of a label in 4 clusters vote; pools of 6
        run(config(private, vote_cluster_size=6, pool_per_cluster=cap, s=6), tmp_path / f"cap{cap}")
        pools = _pool_clusters(tmp_path / f"cap{cap}")
        assert all(len(pool) >= 4 for pool in pools)  # the far pool's draft may take a few
        spread[cap] = [len(set(pool)) for pool in pools]
        most = max(max(pool.count(g) for g in pool) for pool in pools)  # from any one cluster
        assert most <= 2 if cap else most > 2
    assert sum(spread[2]) > sum(spread[0]), spread
    with pytest.raises(ValueError, match="pool_per_cluster: caps the examples per vote cluster"):
        RunConfig(pool_per_cluster=2)
    with pytest.raises(ValueError, match="pool_per_cluster: only for methods whose prompts after round 0"):
        RunConfig(vote_cluster_size=8, pool_per_cluster=2, later_prompt="zero_shot")
