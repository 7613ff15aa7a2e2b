"""Votes on clusters of synthetic samples instead of on single samples (``--vote-cluster-size``).

At epsilon 4 with M = 100 records, the Gaussian noise on one sample's vote (sigma about 5) dwarfs
what the private records put there: after round 0 the noisy near-votes of a WASP run spread barely
more than the noise alone would (standard deviation 5.2 against sigma 5.0 on tweets), so the top-S
"good" examples are close to a random draw.  Clustering each label's samples and voting on the
cluster centres keeps each record's vote vector as it is (its Q nearest centres of its label,
weights 1, 1/2, ...), and so the sensitivity and the noise, but one coordinate now gathers the
votes of a whole cluster: a larger count under the same noise.  The clusters are a function of the
synthetic embeddings and a public seed alone, and a sample's vote is its cluster's noisy vote:
public post-processing, no privacy cost.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from sklearn.cluster import KMeans

from wasp_vllm.privacy.gaussian import check_int
from wasp_vllm.privacy.voting import NoisyVotes

# Inside a cluster every sample carries the cluster's vote; this much less per rank (far below any
# noise scale) orders them by distance to the centre, so a pool takes a cluster's central samples first.
TIE_BREAK = 1e-6


@dataclass(frozen=True)
class Clusters:
    """Each label's synthetic samples grouped around centres (all arrays public)."""

    members: np.ndarray  # [N] the cluster of each sample
    centres: np.ndarray  # [K, d] float32, the points the private records vote on
    labels: np.ndarray  # [K] the label of each cluster
    centrality: np.ndarray  # [N] a sample's rank in its cluster by distance to the centre (0 = nearest)


def cluster_samples(emb: np.ndarray, labels: np.ndarray, size: int, seed: int) -> Clusters:
    """k-means per label with ``ceil(samples / size)`` clusters (one where the label has ``size`` or
    fewer samples), seeded with the run's public ``seed``."""
    size = check_int("size", size, 1)
    emb = np.asarray(emb, dtype=np.float32)
    labels = np.asarray(labels)
    if emb.ndim != 2 or labels.shape != (emb.shape[0],):
        raise ValueError(f"need one label per embedding row, got {emb.shape} and {labels.shape}")
    members = np.zeros(labels.shape[0], dtype=np.int64)
    centrality = np.zeros(labels.shape[0], dtype=np.int64)
    centres: list[np.ndarray] = []
    centre_labels: list[Any] = []
    for label in np.unique(labels):
        rows = np.flatnonzero(labels == label)
        k = math.ceil(rows.size / size)
        fit = KMeans(n_clusters=k, n_init=4, random_state=seed).fit(emb[rows])
        assigned = fit.labels_.astype(np.int64)
        dist = np.linalg.norm(emb[rows] - fit.cluster_centers_[assigned], axis=1)
        for j in range(k):
            inside = np.flatnonzero(assigned == j)
            centrality[rows[inside[np.argsort(dist[inside], kind="stable")]]] = np.arange(inside.size)
        members[rows] = len(centres) + assigned
        centres.extend(fit.cluster_centers_.astype(np.float32))
        centre_labels.extend([label] * k)
    d = emb.shape[1]
    return Clusters(
        members=members,
        centres=np.asarray(centres, dtype=np.float32).reshape(-1, d),
        labels=np.asarray(centre_labels, dtype=labels.dtype),
        centrality=centrality,
    )


def votes_per_sample(votes: NoisyVotes, clusters: Clusters) -> NoisyVotes:
    """Each sample gets its cluster's noisy votes (less ``TIE_BREAK`` per rank from the centre)."""
    if votes.h_near.shape[0] != clusters.centres.shape[0]:
        raise ValueError(f"{votes.h_near.shape[0]} votes for {clusters.centres.shape[0]} clusters")
    offset = TIE_BREAK * clusters.centrality
    near = votes.h_near[clusters.members] - offset
    far = None if votes.h_far is None else votes.h_far[clusters.members] - offset
    return NoisyVotes(h_near=near, h_far=far, sigma=votes.sigma, q=votes.q)


def capped_per_cluster(h_near: np.ndarray, members: np.ndarray, cap: int) -> np.ndarray:
    """Boolean mask: each cluster's ``cap`` samples with the highest noisy votes (inside a cluster,
    the most central ones; ties to the lower row), so a pool spreads over several clusters."""
    cap = check_int("cap", cap, 1)
    members = np.asarray(members)
    if np.shape(h_near) != members.shape:
        raise ValueError(f"need one vote per sample, got {np.shape(h_near)} and {members.shape}")
    rows = np.arange(members.size)
    order = np.lexsort((rows, -np.asarray(h_near, dtype=np.float64), members))  # by cluster, best first
    first = np.searchsorted(members[order], members[order], side="left")
    keep = np.zeros(members.size, dtype=bool)
    keep[order[np.arange(members.size) - first < cap]] = True
    return keep
