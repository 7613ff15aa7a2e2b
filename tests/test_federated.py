"""Tests of the federated privacy machinery: fixed-point ring, secure aggregation, noise shares."""

from __future__ import annotations

import itertools
import math
import random

import numpy as np
import pytest
from scipy import stats

from wasp_vllm.privacy import voting
from wasp_vllm.privacy.federated import (
    SecureAggregation,
    federated_guarantee,
    federated_noisy_votes,
    party_noise_std,
)
from wasp_vllm.privacy.key_agreement import (
    MODP14_G,
    MODP14_P,
    MODP14_Q,
    Modp14KeyAgreement,
    SecureAggregationError,
    X25519KeyAgreement,
    mask_stream,
    pair_seed,
    x25519_available,
)
from wasp_vllm.privacy.secagg import (
    AggregationServer,
    FixedPointCodec,
    FixedPointOverflowError,
    Party,
    secure_sum,
)
from wasp_vllm.privacy.voting import Voters

SCHEMES = [
    pytest.param(Modp14KeyAgreement, id="modp14"),
    pytest.param(
        X25519KeyAgreement,
        id="x25519",
        marks=pytest.mark.skipif(not x25519_available(), reason="cryptography not installed"),
    ),
]


def _seeded_bytes(seed: int):
    """Deterministic key material so the statistical tests cannot flake."""
    return random.Random(seed).randbytes


def _run(vectors: dict[int, np.ndarray], scheme, seed: int = 0, dropped=frozenset()):
    """Build parties and a server for ``vectors`` and run the protocol; return (server, parties, sum)."""
    codec = FixedPointCodec(n_terms=len(vectors))
    server = AggregationServer(codec, length=len(next(iter(vectors.values()))))
    rb = _seeded_bytes(seed)
    parties = [Party(pid, v, codec, key_agreement=scheme, random_bytes=rb) for pid, v in vectors.items()]
    return server, parties, secure_sum(parties, server, dropped=dropped)


# ------------------------------------------------------------------------------------ group


def _pi_times_2_pow(bits: int) -> int:
    """floor(pi * 2^bits) by Machin's formula in integer arithmetic (64 guard bits)."""
    one = 1 << (bits + 64)

    def arctan_inv(x: int) -> int:
        total, term, k, x2 = 0, one // x, 0, x * x
        while term:
            total += term // (2 * k + 1) if k % 2 == 0 else -(term // (2 * k + 1))
            term //= x2
            k += 1
        return total

    return (16 * arctan_inv(5) - 4 * arctan_inv(239)) >> 64


def test_modp14_prime_is_rfc3526_group14() -> None:
    expected = 2**2048 - 2**1984 - 1 + 2**64 * (_pi_times_2_pow(1918) + 124476)
    assert expected == MODP14_P
    assert pow(2, MODP14_P - 1, MODP14_P) == 1 and pow(2, MODP14_Q - 1, MODP14_Q) == 1  # safe prime (Fermat)
    assert pow(MODP14_G, MODP14_Q, MODP14_P) == 1  # g generates the prime-order subgroup


# ------------------------------------------------------------------------------------ codec


def test_codec_roundtrip_within_half_resolution() -> None:
    codec = FixedPointCodec(scale_bits=24, n_terms=3)
    x = np.random.default_rng(0).normal(0, 50, size=1000)
    back = codec.decode(codec.encode(x))
    assert np.max(np.abs(back - x)) <= 2.0**-25
    assert codec.max_decoding_error == 3 * 2.0**-25
    assert codec.max_abs == 2.0**38 / 3


def test_codec_rejects_overflow_and_nonfinite() -> None:
    codec = FixedPointCodec(n_terms=4)
    codec.encode(np.array([codec.max_abs, -codec.max_abs]))
    with pytest.raises(FixedPointOverflowError, match="encodable range"):
        codec.encode(np.array([0.0, np.nextafter(codec.max_abs, np.inf)]))
    for bad in (np.nan, np.inf, -np.inf):
        with pytest.raises(FixedPointOverflowError, match="non-finite"):
            codec.encode(np.array([1.0, bad]))
    with pytest.raises(ValueError):
        FixedPointCodec(scale_bits=60)


def test_codec_extreme_values_sum_without_wraparound() -> None:
    """n_terms vectors at the bound sum to +-2^38 exactly: the bound leaves the int64 range untouched."""
    codec = FixedPointCodec(n_terms=5)
    ring = np.zeros(2, dtype=np.uint64)
    for _ in range(5):
        ring += codec.encode(np.array([codec.max_abs, -codec.max_abs]))
    np.testing.assert_array_equal(codec.decode(ring), [2.0**38, -(2.0**38)])


# ------------------------------------------------------------------------------------ aggregation


@pytest.mark.parametrize("scheme_cls", SCHEMES)
def test_masks_cancel_exactly(scheme_cls) -> None:
    rng = np.random.default_rng(1)
    vectors = {pid: rng.normal(3.0, 40.0, size=257) for pid in (0, 3, 4, 9, 11)}
    server, _, total = _run(vectors, scheme_cls())
    codec = server.codec
    ring_expected = np.zeros(257, dtype=np.uint64)
    for v in vectors.values():
        ring_expected += codec.encode(v)
    np.testing.assert_array_equal(server.aggregate_ring(), ring_expected)  # exact in Z/2^64
    plain = np.sum(list(vectors.values()), axis=0)
    assert np.max(np.abs(total - plain)) <= codec.max_decoding_error + 1e-12


def test_server_never_holds_an_unmasked_vector() -> None:
    rng = np.random.default_rng(2)
    vectors = {pid: rng.normal(0, 5, size=64) for pid in range(4)}
    server, _, _ = _run(vectors, Modp14KeyAgreement())
    encoded = [server.codec.encode(v) for v in vectors.values()]

    def arrays(obj, depth=0):
        if isinstance(obj, np.ndarray):
            yield obj
        elif depth < 4 and isinstance(obj, dict):
            for v in obj.values():
                yield from arrays(v, depth + 1)
        elif depth < 4 and hasattr(obj, "__dict__"):
            yield from arrays(vars(obj), depth + 1)

    held = list(arrays(server))
    assert len(held) == 4 and all(a.dtype == np.uint64 for a in held)
    for a in held:
        for v, e in zip(vectors.values(), encoded, strict=True):
            assert not np.array_equal(a, e) and not np.allclose(a.view(np.int64) / 2.0**24, v)
            # masked values spread over the whole ring, the encodings stay near 0 (or 2^64)
            assert np.mean(np.abs(a.view(np.int64).astype(float))) > 2.0**60


def test_party_does_not_expose_its_vector() -> None:
    codec = FixedPointCodec(n_terms=2)
    party = Party(7, np.array([123.456, 789.0]), codec, key_agreement=Modp14KeyAgreement())
    assert "123" not in repr(party) and "789" not in repr(party)
    assert not hasattr(party, "__dict__")
    assert all(name.startswith("_") or name in ("party_id", "public_key") for name in Party.__slots__)


@pytest.mark.parametrize("scheme_cls", SCHEMES)
def test_masked_vector_is_uniform_whatever_the_input(scheme_cls) -> None:
    """Party 0's masked vector, over draws of its key (others fixed), is uniform on Z/2^64 for any input."""
    scheme = scheme_cls()
    draws = 60 if scheme_cls is Modp14KeyAgreement else 250
    length = 64
    codec = FixedPointCodec(n_terms=3)
    rb = _seeded_bytes(11)
    others = {
        pid: Party(pid, np.zeros(length), codec, key_agreement=scheme, random_bytes=rb) for pid in (1, 2)
    }
    session = b"fixed-session-00"
    hist_a = np.zeros(length)
    hist_b = np.random.default_rng(3).uniform(1e3, 1e9, size=length)

    def masked_samples(hist: np.ndarray, seed: int) -> np.ndarray:
        rb0 = _seeded_bytes(seed)
        out = []
        for _ in range(draws):
            p0 = Party(0, hist, codec, key_agreement=scheme, random_bytes=rb0)
            roster = {0: p0.public_key, **{pid: p.public_key for pid, p in others.items()}}
            out.append(p0.masked_vector(roster, session))
        return np.concatenate(out)

    a, b = masked_samples(hist_a, 100), masked_samples(hist_b, 200)
    for sample in (a, b):
        for byte in (sample >> np.uint64(56), sample & np.uint64(0xFF)):  # top and bottom bytes
            counts = np.bincount(byte.astype(np.int64), minlength=256)
            assert stats.chisquare(counts).pvalue > 1e-4
    top53 = lambda x: (x >> np.uint64(11)).astype(np.float64)  # noqa: E731 (exact in float64)
    assert stats.ks_2samp(top53(a), top53(b)).pvalue > 1e-4
    # the same test has power: unmasked encodings of A and B are told apart at once
    enc_a, enc_b = np.tile(codec.encode(hist_a), draws), np.tile(codec.encode(hist_b), draws)
    assert stats.ks_2samp(top53(enc_a), top53(enc_b)).pvalue < 1e-10


def test_pair_seeds_are_symmetric_and_bound_to_the_session() -> None:
    s = b"\x01" * 32
    assert pair_seed(s, b"round-1", "x", 2, 5) == pair_seed(s, b"round-1", "x", 5, 2)
    assert pair_seed(s, b"round-1", "x", 2, 5) != pair_seed(s, b"round-2", "x", 2, 5)
    assert pair_seed(s, b"round-1", "x", 2, 5) != pair_seed(s, b"round-1", "x", 2, 6)
    prgs = ["shake-256"] + (["aes-256-ctr"] if x25519_available() else [])
    for prg in prgs:
        m = mask_stream(pair_seed(s, b"r", "x", 0, 1), 4096, prg)
        assert m.dtype == np.uint64 and m.shape == (4096,)
        np.testing.assert_array_equal(m[:10], mask_stream(pair_seed(s, b"r", "x", 0, 1), 10, prg))
        assert stats.chisquare(np.bincount((m >> np.uint64(60)).astype(np.int64), minlength=16)).pvalue > 1e-4
    with pytest.raises(ValueError, match="unknown mask PRG"):
        mask_stream(s, 4, "md5")


def test_dropout_after_key_agreement_is_refused_naming_the_parties() -> None:
    vectors = {pid: np.ones(8) for pid in range(5)}
    with pytest.raises(SecureAggregationError, match=r"parties \[1, 3\] dropped out"):
        _run(vectors, Modp14KeyAgreement(), dropped=frozenset({1, 3}))


def test_absent_before_key_agreement_is_left_out() -> None:
    codec = FixedPointCodec(n_terms=4)
    scheme = Modp14KeyAgreement()
    vals = {pid: np.full(6, float(pid + 1)) for pid in range(4)}
    parties = [Party(pid, v, codec, key_agreement=scheme) for pid, v in vals.items()]
    server = AggregationServer(codec, length=6, min_parties=3)
    total = secure_sum(parties[:3], server)  # party 3 never advertised its key
    np.testing.assert_allclose(total, np.full(6, 6.0), atol=codec.max_decoding_error)
    short = AggregationServer(codec, length=6, min_parties=3)
    with pytest.raises(SecureAggregationError, match="at least 3 needed"):
        secure_sum(parties[:2], short)


def test_protocol_misuse_is_rejected() -> None:
    codec = FixedPointCodec(n_terms=3)
    scheme = Modp14KeyAgreement()
    parties = [Party(pid, np.zeros(4), codec, key_agreement=scheme) for pid in range(3)]
    server = AggregationServer(codec, length=4)
    for p in parties[:2]:
        p.advertise(server)
    with pytest.raises(SecureAggregationError, match="twice"):
        parties[0].advertise(server)
    with pytest.raises(SecureAggregationError, match="not settled"):
        parties[0].contribute(server)
    server.settle()
    with pytest.raises(SecureAggregationError, match="after the roster"):
        parties[2].advertise(server)
    with pytest.raises(SecureAggregationError, match="not in the settled roster"):
        parties[2].contribute(server)
    with pytest.raises(SecureAggregationError, match="malformed"):
        server.submit(0, np.zeros(4))  # float, not a ring vector
    parties[0].contribute(server)
    with pytest.raises(SecureAggregationError, match="twice"):
        parties[0].contribute(server)
    with pytest.raises(ValueError):
        AggregationServer(codec, length=4, min_parties=1)


def test_invalid_public_keys_are_rejected() -> None:
    scheme = Modp14KeyAgreement()
    secret, _ = scheme.generate(_seeded_bytes(0))
    for y in (0, 1, MODP14_P - 1):  # trivial / order-2 elements
        with pytest.raises(SecureAggregationError, match="invalid"):
            scheme.agree(secret, y.to_bytes(256, "big"))
    with pytest.raises(SecureAggregationError, match="malformed"):
        scheme.agree(secret, b"\x02")
    if x25519_available():
        xs = X25519KeyAgreement()
        xsecret, _ = xs.generate(_seeded_bytes(0))
        with pytest.raises(SecureAggregationError, match="invalid"):
            xs.agree(xsecret, bytes(32))  # low-order point


# ------------------------------------------------------------------------------------ noise shares


def test_paper_noise_shares_sum_to_sigma_squared() -> None:
    for n in (1, 2, 7, 150):
        std = party_noise_std(3.5, n, "paper")
        assert math.isclose(n * std**2, 3.5**2, rel_tol=1e-12)


def test_exact_noise_shares_cover_any_honest_subset() -> None:
    sigma, n = 2.0, 6
    for t in range(n):
        std = party_noise_std(sigma, n, "exact", tolerance=t)
        for honest in itertools.combinations(range(n), n - t):
            assert len(honest) * std**2 >= sigma**2 * (1 - 1e-12)
    assert party_noise_std(sigma, n, "exact") == party_noise_std(sigma, n, "paper")


@pytest.mark.parametrize(
    ("args", "kwargs"),
    [
        ((1.0, 3, "exact"), {"tolerance": 3}),
        ((1.0, 3, "exact"), {"tolerance": -1}),
        ((1.0, 3, "paper"), {"tolerance": 1}),
        ((1.0, 3, "central"), {}),
        ((-1.0, 3, "exact"), {}),
        ((1.0, 0, "exact"), {}),
    ],
)
def test_noise_share_validation(args, kwargs) -> None:
    with pytest.raises(ValueError):
        party_noise_std(*args, **kwargs)


def test_guarantee_for_manifest() -> None:
    g = federated_guarantee(4.0, 8, "exact", tolerance=2, epsilon=4.0, delta=1e-5)
    assert g["parties"] == 8 and g["tolerance"] == 2
    assert math.isclose(g["noise_per_party_std"], 4.0 / math.sqrt(6))
    assert math.isclose(g["honest_noise_std_min"], 4.0)
    assert "coalition of up to 2 parties" in g["guarantee"] and "(4.0, 1e-05)" in g["guarantee"]
    assert "server only" in federated_guarantee(4.0, 8, "paper")["guarantee"]


# ------------------------------------------------------------------------------------ end to end


def seeded(seed: int):
    """Per-party noise generators for tests (a real run derives them from its secret key)."""
    return lambda party: np.random.default_rng([seed, party])


def _toy_data(seed: int = 0, n_private: int = 40, n_synth: int = 300, dim: int = 8, n_labels: int = 3):
    rng = np.random.default_rng(seed)
    priv = rng.normal(size=(n_private, dim)).astype(np.float32)
    synth = rng.normal(size=(n_synth, dim)).astype(np.float32)
    return priv, rng.integers(0, n_labels, n_private), synth, rng.integers(0, n_labels, n_synth)


def test_federated_votes_equal_sum_of_local_clean_histograms() -> None:
    priv, plab, synth, slab = _toy_data()
    parties = np.arange(len(priv)) % 5 * 10  # ids 0, 10, ..., 40
    votes, report = federated_noisy_votes(
        Voters(priv, plab, parties), synth, slab, q=4, sigma=0.0, noise=seeded(1)
    )
    near_sum, far_sum = np.zeros(len(synth)), np.zeros(len(synth))
    for pid in np.unique(parties):
        n, f = voting.clean_histograms(priv[parties == pid], plab[parties == pid], synth, slab, 4)
        near_sum += n
        far_sum += f
    tol = report["max_decoding_error"] + 1e-9
    np.testing.assert_allclose(votes.h_near, near_sum, atol=tol, rtol=0)
    assert votes.h_far is not None  # the default protocol releases both histograms
    np.testing.assert_allclose(votes.h_far, far_sum, atol=tol, rtol=0)
    central_near, _ = voting.clean_histograms(priv, plab, synth, slab, 4)
    np.testing.assert_allclose(votes.h_near, central_near, atol=tol + 1e-9, rtol=0)  # votes are additive
    assert isinstance(votes, voting.NoisyVotes) and votes.q == 4
    assert report["parties"] == 5 and not any("records" in key for key in report)  # no party sizes
    assert report["ring"] == "Z/2^64" and report["scale"] == 2.0**24


@pytest.mark.parametrize(("mode", "tolerance"), [("paper", 0), ("exact", 2)])
def test_federated_noise_has_the_right_variance(mode, tolerance) -> None:
    priv, plab, synth, slab = _toy_data(seed=4, n_synth=400)
    parties = np.arange(len(priv)) % 4
    sigma = 3.0
    clean = np.concatenate(voting.clean_histograms(priv, plab, synth, slab, 4))
    residuals = []
    for seed in range(4):
        votes, _ = federated_noisy_votes(
            Voters(priv, plab, parties),
            synth,
            slab,
            4,
            sigma,
            seeded(seed),
            SecureAggregation(mode, tolerance),
        )
        assert votes.sigma == sigma
        residuals.append(np.concatenate([votes.h_near, votes.h_far]) - clean)
    res = np.concatenate(residuals)  # 3200 draws
    expected_var = sigma**2 * 4 / (4 - tolerance)
    assert abs(res.var() / expected_var - 1) < 0.1
    assert abs(res.mean()) < 4 * math.sqrt(expected_var / res.size)


def test_federated_votes_are_reproducible_and_validated() -> None:
    priv, plab, synth, slab = _toy_data(n_synth=50)
    parties = np.arange(len(priv)) % 3
    a, _ = federated_noisy_votes(Voters(priv, plab, parties), synth, slab, 4, 2.0, seeded(9))
    b, _ = federated_noisy_votes(Voters(priv, plab, parties), synth, slab, 4, 2.0, seeded(9))
    c, _ = federated_noisy_votes(Voters(priv, plab, parties), synth, slab, 4, 2.0, seeded(10))
    np.testing.assert_array_equal(a.h_near, b.h_near)  # fresh keys each call; masks cancel exactly
    assert not np.allclose(a.h_near, c.h_near)
    with pytest.raises(ValueError, match="at least 2 parties"):
        federated_noisy_votes(Voters(priv, plab, np.zeros(len(priv), int)), synth, slab, 4, 2.0, seeded(0))
    with pytest.raises(ValueError, match="one party id per"):
        federated_noisy_votes(Voters(priv, plab, parties[:-1]), synth, slab, 4, 2.0, seeded(0))


def test_every_party_of_the_roster_adds_noise_even_without_records() -> None:
    """How many noise shares reach the sum must not depend on which parties hold records."""
    priv, plab, synth, slab = _toy_data(n_synth=300)
    parties = np.zeros(len(priv), dtype=np.int64)  # every record at party 0 of 4
    clean = np.concatenate(voting.clean_histograms(priv, plab, synth, slab, 4))
    votes, report = federated_noisy_votes(
        Voters(priv, plab, parties), synth, slab, 4, 2.0, seeded(3), SecureAggregation(n_parties=4)
    )
    residual = np.concatenate([votes.h_near, votes.h_far]) - clean
    assert report["parties"] == 4
    assert abs(residual.std() / 2.0 - 1) < 0.1


def test_falls_back_to_pure_python_dh_without_cryptography(monkeypatch) -> None:
    import sys

    from wasp_vllm.privacy.key_agreement import default_key_agreement

    for name in [m for m in sys.modules if m == "cryptography" or m.startswith("cryptography.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "cryptography", None)  # makes `import cryptography...` fail
    assert not x25519_available()
    scheme = default_key_agreement()
    assert isinstance(scheme, Modp14KeyAgreement) and scheme.prg == "shake-256"
    _, _, total = _run({0: np.ones(3), 1: np.full(3, 2.0)}, scheme)
    np.testing.assert_allclose(total, np.full(3, 3.0), atol=1e-6)
