"""Federated WASP (the paper's Algorithm 2): local votes, local noise shares, secure aggregation.

In the federated setting the private records are spread over L data parties. Each party votes on
its own records (``clean_histograms``), adds its *share* of the Gaussian noise, and sends its
histograms to the server only through a secure-aggregation protocol, so that the server learns the
SUM of the L noisy histograms and nothing else about any single party.

The secure-aggregation protocol itself (codec, key agreement, masks) is in :mod:`.secagg`; this
module holds the noise shares, the guarantee they give, and the federated voting step.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from wasp_vllm.privacy.secagg import (
    DEFAULT_SCALE_BITS,
    RING_BITS,
    AggregationServer,
    FixedPointCodec,
    KeyAgreement,
    Party,
    default_key_agreement,
    secure_sum,
)
from wasp_vllm.privacy.voting import NoisyVotes, Voters, clean_histograms

logger = logging.getLogger(__name__)

#: How the noise is shared: "paper" (sigma^2/L each) or "exact" (sigma^2/(L-t) each), as the accountant.
NoiseMode = str


# --------------------------------------------------------------------------------------------
# Noise shares and the guarantee
# --------------------------------------------------------------------------------------------


def party_noise_std(sigma: float, n_parties: int, mode: NoiseMode, tolerance: int = 0) -> float:
    """Standard deviation of the Gaussian noise each party adds.

    ``paper``: N(0, sigma^2 / L), so the L shares sum to exactly sigma^2 (Algorithm 2 as printed;
    assumes every party is honest and present). ``exact``: N(0, sigma^2 / (L - t)), so any L - t
    honest parties alone reach sigma^2 even if t parties collude with the server (and subtract
    their own noise) or drop out before key agreement.
    """
    if sigma < 0 or not math.isfinite(sigma):
        raise ValueError("sigma must be finite and >= 0")
    if n_parties < 1:
        raise ValueError("n_parties must be >= 1")
    if not 0 <= tolerance < n_parties:
        raise ValueError("tolerance must satisfy 0 <= tolerance < n_parties")
    if mode == "paper":
        if tolerance:
            raise ValueError("paper mode has no tolerance; use mode='exact' with tolerance > 0")
        return sigma / math.sqrt(n_parties)
    if mode == "exact":
        return sigma / math.sqrt(n_parties - tolerance)
    raise ValueError(f"unknown noise mode {mode!r}; expected 'paper' or 'exact'")


def federated_guarantee(
    sigma: float,
    n_parties: int,
    mode: NoiseMode,
    tolerance: int = 0,
    epsilon: float | None = None,
    delta: float | None = None,
) -> dict[str, Any]:
    """What the federated noise protects against, for the run manifest."""
    std = party_noise_std(sigma, n_parties, mode, tolerance)
    eps_delta = f"({epsilon}, {delta})" if epsilon is not None and delta is not None else "(eps, delta)"
    if mode == "paper":
        text = (
            f"{eps_delta}-DP against the server only, if all {n_parties} parties add their noise share; "
            f"a coalition of c parties that removes its own shares leaves only (L-c)/L of sigma^2"
        )
    elif tolerance == 0:
        text = f"{eps_delta}-DP against the server (any party colluding with it weakens the noise)"
    else:
        text = (
            f"{eps_delta}-DP against the server and any coalition of up to {tolerance} parties "
            f"(or up to {tolerance} parties dropping out before key agreement)"
        )
    return {
        "parties": n_parties,
        "mode": mode,
        "tolerance": tolerance,
        "sigma": float(sigma),
        "noise_per_party_std": std,
        "total_noise_std": std * math.sqrt(n_parties),
        "honest_noise_std_min": std * math.sqrt(n_parties - tolerance),
        "guarantee": text,
        "threat_model": "honest-but-curious server and parties; secure aggregation reveals only the sum",
    }


# --------------------------------------------------------------------------------------------
# Federated voting
# --------------------------------------------------------------------------------------------


#: ``noise(party_id) -> generator`` of that party's secret noise share (fresh OS entropy when None).
PartyNoise = Callable[[int], np.random.Generator]


def _local_noisy_histograms(
    emb: np.ndarray,
    labels: np.ndarray,
    synth_emb: np.ndarray,
    synth_labels: np.ndarray,
    q: int,
    noise_std: float,
    rng: np.random.Generator,
    far: bool = True,
) -> np.ndarray:
    """One party's work before masking: vote on its own records (``far=False``: ``H_near`` only),
    then add its noise share."""
    near, far_votes = clean_histograms(emb, labels, synth_emb, synth_labels, q)
    released = [near, far_votes] if far else [near]
    local = np.concatenate([np.asarray(h, dtype=np.float64) for h in released])
    if noise_std > 0:
        local = local + rng.normal(0.0, noise_std, size=local.shape)
    return local


def _party_ids(parties: np.ndarray, n_records: int, n_parties: int | None) -> np.ndarray:
    """Validate the per-record party assignment and return the ids of the parties taking part.

    With ``n_parties`` every party ``0 .. n_parties-1`` takes part, holding records or not: how
    many parties add noise must not depend on the data.
    """
    arr = np.asarray(parties)
    if arr.shape != (n_records,):
        raise ValueError("parties must give one party id per private record")
    if n_records and not np.issubdtype(arr.dtype, np.integer):
        raise TypeError("party ids must be integers")
    ids = np.unique(arr).astype(np.int64)
    if ids.size and ids[0] < 0:
        raise ValueError("party ids must be non-negative")
    if n_parties is not None:
        if ids.size and ids[-1] >= n_parties:
            raise ValueError(f"party ids must lie in [0, {n_parties})")
        ids = np.arange(n_parties, dtype=np.int64)
    if ids.size < 2:
        raise ValueError("federated voting needs at least 2 parties (use the central mechanism for one)")
    return ids


@dataclass(frozen=True)
class SecureAggregation:
    """The public parameters of the parties' protocol: how they noise their votes and sum them.

    ``mode``/``tolerance``: each party's noise share (paper: sigma^2/L; exact: sigma^2/(L-t), so
    up to ``tolerance`` absent parties still leave sigma^2).  ``n_parties``: the roster (every
    party takes part, holding records or not); None = the parties that hold records.  ``far``: the
    parties release ``H_far`` beside ``H_near`` (False where the run never shows the far pool).
    """

    mode: NoiseMode = "exact"
    tolerance: int = 0
    n_parties: int | None = None
    scale_bits: int = DEFAULT_SCALE_BITS
    key_agreement: KeyAgreement | None = None
    far: bool = True


def federated_noisy_votes(
    voters: Voters,
    synth_emb: np.ndarray,
    synth_labels: np.ndarray,
    q: int,
    sigma: float,
    noise: PartyNoise | None,
    protocol: SecureAggregation = SecureAggregation(),
) -> tuple[NoisyVotes, dict[str, Any]]:
    """Algorithm 2's voting step: local votes + local noise shares, summed by secure aggregation.

    Returns ``(NoisyVotes, report)``. The votes are the sum over parties of their clean
    histograms plus the sum of their noise shares (variance sigma^2 in paper mode, L/(L-t) sigma^2
    in exact mode). ``noise(party_id)`` is that party's noise generator: in a deployment each
    party's own secret; in simulation derived from the run's secret key, the round and the party
    (never a short or public seed: the server could replay it). ``voters.parties`` gives each
    record's party. ``sigma = 0`` is accepted for tests only (no privacy) and logged as a warning.
    """
    if voters.parties is None:
        raise ValueError("federated voting needs a party per record")
    private_emb, private_labels = np.asarray(voters.embeddings), np.asarray(voters.labels)
    parties = np.asarray(voters.parties)
    p = protocol
    ids = _party_ids(parties, len(private_emb), p.n_parties)
    n_parties = int(ids.size)
    std = party_noise_std(sigma, n_parties, p.mode, p.tolerance)
    if sigma == 0:
        logger.warning("federated voting with sigma = 0: the aggregated votes are NOT differentially private")
    n_synth = len(synth_emb)
    codec = FixedPointCodec(scale_bits=p.scale_bits, n_terms=n_parties)
    length = (2 if p.far else 1) * n_synth
    server = AggregationServer(codec, length=length, min_parties=max(2, n_parties - p.tolerance))
    scheme = p.key_agreement or default_key_agreement()

    members = []
    for pid in ids.tolist():
        own = parties == pid
        rng = noise(pid) if noise is not None else np.random.default_rng()
        local = _local_noisy_histograms(
            private_emb[own], private_labels[own], synth_emb, synth_labels, q, std, rng, p.far
        )
        members.append(Party(pid, local, codec, key_agreement=scheme))
    logger.debug(
        "federated voting: %d parties, %d synthetic samples, scheme %s", n_parties, n_synth, scheme.name
    )
    total = secure_sum(members, server)

    h_far = total[n_synth:] if p.far else None
    votes = NoisyVotes(h_near=total[:n_synth], h_far=h_far, sigma=float(sigma), q=int(q))
    return votes, federated_report(sigma, n_parties, p.mode, p.tolerance, p.scale_bits, scheme)


def federated_report(
    sigma: float,
    n_parties: int,
    mode: NoiseMode,
    tolerance: int = 0,
    scale_bits: int = DEFAULT_SCALE_BITS,
    scheme: KeyAgreement | None = None,
) -> dict[str, Any]:
    """The manifest entry of a federated aggregation: public parameters only (no party sizes,
    which are exact statistics of the private data)."""
    codec = FixedPointCodec(scale_bits=scale_bits, n_terms=n_parties)
    scheme = scheme or default_key_agreement()
    return {
        **federated_guarantee(sigma, n_parties, mode, tolerance),
        "masking": "pairwise additive masks (Bonawitz et al. 2016), honest-but-curious",
        "key_agreement": scheme.name,
        "prg": f"SHA-256 pair seed -> {scheme.prg}",
        "ring": f"Z/2^{RING_BITS}",
        "scale": codec.scale,
        "scale_bits": codec.scale_bits,
        "max_abs_per_party": codec.max_abs,
        "max_decoding_error": codec.max_decoding_error,
        "dropout": "refused after key agreement (no recovery); "
        "before it, up to `tolerance` parties may be absent",
    }
