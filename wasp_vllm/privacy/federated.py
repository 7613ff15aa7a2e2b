"""Federated WASP (the paper's Algorithm 2): local votes, local noise shares, secure aggregation.

In the federated setting the private records are spread over L data parties. Each party votes on
its own records (``clean_histograms``), adds its *share* of the Gaussian noise, and sends its
histograms to the server only through a secure-aggregation protocol, so that the server learns the
SUM of the L noisy histograms and nothing else about any single party.

Secure aggregation follows the pairwise-additive-mask construction of Bonawitz et al. 2016
("Practical Secure Aggregation for Federated Learning on User-Held Data"), honest-but-curious
variant without dropout recovery:

* **Encoding.** Float vectors are encoded as fixed-point integers in the ring Z/2^64 (numpy
  ``uint64`` arithmetic wraps around, which *is* arithmetic mod 2^64). A value v becomes
  ``round(v * 2^scale_bits)`` in two's complement. The default ``scale_bits = 24`` gives a
  resolution of 2^-24 (about 6e-8). To make overflow of the *sum* impossible, every party's
  values must satisfy ``|v| <= 2^(62 - scale_bits) / L`` (about 2.7e11 / L at scale 2^24);
  larger or non-finite values are rejected with :class:`FixedPointOverflowError`. The decoded sum
  differs from the float sum by at most ``L * 2^-(scale_bits + 1)`` (rounding of each term) plus
  float64 rounding of the result (relative 2^-53).
* **Key agreement.** Every party holds its own secret key; only public keys travel, through the
  server. Each pair of parties (i < j) derives the same shared secret with X25519 (when the
  ``cryptography`` package is importable) or with finite-field Diffie-Hellman over the RFC 3526
  2048-bit MODP group 14 in pure Python (always available; about 50x slower: ~2.5 ms per
  modular exponentiation, L(L-1) of them, so about a minute for L = 150 on one core).
* **Masks.** The shared secret, the session id and the two party ids are hashed (SHA-256) into a
  pair seed, which a cryptographic PRG expands into a uniform mask vector over Z/2^64: AES-256-CTR
  (keystream of the seed as key) alongside X25519, SHAKE-256 (an extendable-output function) with
  MODP-14, so the pure-Python suite needs nothing beyond the standard library. Party i adds the
  masks of pairs (i, j > i) and subtracts those of pairs (i, j < i); the masks cancel exactly in
  the sum, while each single masked vector is uniformly distributed over the ring whatever the
  party's input (the mask of a pair with an honest party is uniform and unknown to the server).
* **Dropout.** Refused, not recovered: once the key roster is settled, the sum can only be
  unmasked if every party in the roster delivers its masked vector. If some do not,
  :meth:`AggregationServer.aggregate` raises :class:`SecureAggregationError` naming the missing
  party ids. (Bonawitz's recovery, Shamir shares of the mask keys, is not implemented.) Parties
  that drop out *before* the roster is settled are simply left out; the server refuses to settle
  with fewer than ``min_parties``, which :func:`federated_noisy_votes` sets to ``L - tolerance``
  so that the noise of the remaining parties still reaches sigma^2 in ``exact`` mode.

Threat model: an honest-but-curious server (it follows the protocol; it does not forge rosters or
keys), and honest-but-curious parties. The DP guarantee of the released sum comes from the noise;
secure aggregation only ensures that nothing *less* noisy than the sum is ever revealed.
"""

from __future__ import annotations

import hashlib
import logging
import math
import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from types import MappingProxyType
from typing import Any, Literal, Protocol

import numpy as np

from wasp_vllm.privacy.voting import NoisyVotes, clean_histograms

logger = logging.getLogger(__name__)

RING_BITS = 64
DEFAULT_SCALE_BITS = 24
_SESSION_BYTES = 16
_KDF_DOMAIN = b"wasp-vllm/secagg/pair-seed/v1"

NoiseMode = Literal["paper", "exact"]
RandomBytes = Callable[[int], bytes]


class SecureAggregationError(RuntimeError):
    """The secure-aggregation protocol cannot (or must not) proceed."""


class FixedPointOverflowError(SecureAggregationError, ValueError):
    """A value cannot be encoded without risking overflow of the ring sum."""


# --------------------------------------------------------------------------------------------
# Fixed-point encoding into Z/2^64
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FixedPointCodec:
    """Fixed-point encoding of float vectors into Z/2^64, sized for a sum of ``n_terms`` vectors.

    The per-term bound ``2^(62 - scale_bits) / n_terms`` keeps the integer sum below 2^62 + n/2 in
    absolute value, far inside the signed 64-bit range, so decoding the ring sum as a two's
    complement integer is always correct.
    """

    scale_bits: int = DEFAULT_SCALE_BITS
    n_terms: int = 1

    def __post_init__(self) -> None:
        if not 0 <= self.scale_bits <= 52:
            raise ValueError("scale_bits must be in [0, 52]")
        if self.n_terms < 1:
            raise ValueError("n_terms must be >= 1")

    @property
    def scale(self) -> float:
        """Multiplier from values to ring integers (2^scale_bits)."""
        return math.ldexp(1.0, self.scale_bits)

    @property
    def max_abs(self) -> float:
        """Largest absolute value one term may have."""
        return math.ldexp(1.0, 62 - self.scale_bits) / self.n_terms

    @property
    def max_decoding_error(self) -> float:
        """Bound on |decoded sum - float sum| from fixed-point rounding (excl. float64 rounding)."""
        return self.n_terms * math.ldexp(1.0, -(self.scale_bits + 1))

    def encode(self, values: np.ndarray) -> np.ndarray:
        """Encode floats as uint64 ring elements; raise rather than silently wrap around."""
        arr = np.asarray(values, dtype=np.float64)
        if arr.ndim != 1:
            raise ValueError("only 1-D vectors can be encoded")
        if not np.all(np.isfinite(arr)):
            raise FixedPointOverflowError("cannot encode non-finite values (nan or inf)")
        if arr.size and float(np.max(np.abs(arr))) > self.max_abs:
            raise FixedPointOverflowError(
                f"a value exceeds the encodable range |v| <= {self.max_abs:.6g} "
                f"(scale 2^{self.scale_bits}, {self.n_terms} summed terms); "
                "lower scale_bits or clip the inputs"
            )
        return np.rint(np.ldexp(arr, self.scale_bits)).astype(np.int64).view(np.uint64)

    def decode(self, ring_values: np.ndarray) -> np.ndarray:
        """Decode uint64 ring elements (two's complement) back to floats."""
        arr = np.asarray(ring_values)
        if arr.dtype != np.uint64:
            raise TypeError("ring values must be uint64")
        return np.ldexp(arr.view(np.int64).astype(np.float64), -self.scale_bits)


# --------------------------------------------------------------------------------------------
# Key agreement
# --------------------------------------------------------------------------------------------

# RFC 3526, section 3: the 2048-bit MODP group 14, p = 2^2048 - 2^1984 - 1 + 2^64 * ([2^1918 pi] + 124476).
MODP14_P = int(
    "FFFFFFFFFFFFFFFFC90FDAA22168C234C4C6628B80DC1CD1"
    "29024E088A67CC74020BBEA63B139B22514A08798E3404DD"
    "EF9519B3CD3A431B302B0A6DF25F14374FE1356D6D51C245"
    "E485B576625E7EC6F44C42E9A637ED6B0BFF5CB6F406B7ED"
    "EE386BFB5A899FA5AE9F24117C4B1FE649286651ECE45B3D"
    "C2007CB8A163BF0598DA48361C55D39A69163FA8FD24CF5F"
    "83655D23DCA3AD961C62F356208552BB9ED529077096966D"
    "670C354E4ABC9804F1746C08CA18217C32905E462E36CE3B"
    "E39E772C180E86039B2783A2EC07A28FB5C55DF06F4C52C9"
    "DE2BCBF6955817183995497CEA956AE515D2261898FA0510"
    "15728E5A8AACAA68FFFFFFFFFFFFFFFF",
    16,
)
MODP14_G = 2
MODP14_Q = (MODP14_P - 1) // 2  # p is a safe prime; g = 2 generates the subgroup of prime order q
_MODP14_BYTES = 256
_MODP14_EXPONENT_BITS = 256  # 2x the group's ~112-bit strength (NIST SP 800-56A short exponents)


class KeyAgreement(Protocol):
    """Two-party key agreement: each side combines its secret with the other's public key."""

    name: str
    prg: str  # the mask PRG of this suite, see mask_stream

    def generate(self, random_bytes: RandomBytes) -> tuple[Any, bytes]:
        """Return (secret key, public key bytes)."""
        ...

    def agree(self, secret: Any, peer_public: bytes) -> bytes:
        """Return the shared secret with the holder of ``peer_public``."""
        ...


@lru_cache(maxsize=4096)
def _modp14_valid_public(y: int) -> bool:
    """Full public-key validation (range and prime-order subgroup); cached as it costs ~20 ms."""
    return 1 < y < MODP14_P - 1 and pow(y, MODP14_Q, MODP14_P) == 1


class Modp14KeyAgreement:
    """Finite-field Diffie-Hellman over RFC 3526 group 14, pure Python (no extra dependency)."""

    name = "ffdh-modp14-rfc3526"
    prg = "shake-256"

    def generate(self, random_bytes: RandomBytes) -> tuple[int, bytes]:
        """Draw a 256-bit exponent (top bit forced, so never 0 or 1) and its public key g^x."""
        nbytes = _MODP14_EXPONENT_BITS // 8
        x = int.from_bytes(random_bytes(nbytes), "big") | (1 << (_MODP14_EXPONENT_BITS - 1))
        return x, pow(MODP14_G, x, MODP14_P).to_bytes(_MODP14_BYTES, "big")

    def agree(self, secret: int, peer_public: bytes) -> bytes:
        """Validate the peer key (small-subgroup attacks) and return g^(xy) as 256 bytes."""
        if len(peer_public) != _MODP14_BYTES:
            raise SecureAggregationError("malformed MODP-14 public key")
        y = int.from_bytes(peer_public, "big")
        if not _modp14_valid_public(y):
            raise SecureAggregationError("invalid MODP-14 public key (outside the prime-order subgroup)")
        return pow(y, secret, MODP14_P).to_bytes(_MODP14_BYTES, "big")


class X25519KeyAgreement:
    """X25519 (RFC 7748) through the ``cryptography`` package; fast, used when it is importable."""

    name = "x25519"
    prg = "aes-256-ctr"

    def __init__(self) -> None:
        from cryptography.hazmat.primitives.asymmetric import x25519

        self._x25519 = x25519

    def generate(self, random_bytes: RandomBytes) -> tuple[Any, bytes]:
        """Any 32 random bytes are a valid X25519 private key (RFC 7748 clamps them internally)."""
        secret = self._x25519.X25519PrivateKey.from_private_bytes(random_bytes(32))
        return secret, secret.public_key().public_bytes_raw()

    def agree(self, secret: Any, peer_public: bytes) -> bytes:
        """Return the X25519 shared secret; low-order peer keys are rejected by the library."""
        try:
            peer = self._x25519.X25519PublicKey.from_public_bytes(peer_public)
            return secret.exchange(peer)
        except ValueError as exc:
            raise SecureAggregationError("invalid X25519 public key") from exc


def x25519_available() -> bool:
    """Whether the optional ``cryptography`` package (and thus X25519) can be used."""
    try:
        from cryptography.hazmat.primitives.asymmetric import x25519  # noqa: F401
    except ImportError:
        return False
    return True


def default_key_agreement() -> KeyAgreement:
    """X25519 when ``cryptography`` is installed (fast), else pure-Python MODP-14 DH."""
    return X25519KeyAgreement() if x25519_available() else Modp14KeyAgreement()


# --------------------------------------------------------------------------------------------
# Pairwise masks
# --------------------------------------------------------------------------------------------


def _check_party_id(party_id: int) -> int:
    """Party ids are non-negative ints below 2^63: they order the pairs and enter the KDF."""
    if isinstance(party_id, bool) or not isinstance(party_id, (int, np.integer)):
        raise TypeError("party ids must be integers")
    pid = int(party_id)
    if not 0 <= pid < 2**63:
        raise ValueError("party ids must be in [0, 2^63)")
    return pid


def pair_seed(shared_secret: bytes, session: bytes, scheme: str, a: int, b: int) -> bytes:
    """Hash a DH shared secret into a 32-byte mask seed bound to the session and the (unordered) pair.

    Binding to the session id makes masks single-use even if keys were reused across rounds
    (reusing a mask would reveal the difference of two rounds' inputs).
    """
    lo, hi = sorted((a, b))
    ids = (lo.to_bytes(8, "big"), hi.to_bytes(8, "big"))
    fields = [_KDF_DOMAIN, scheme.encode(), session, *ids, shared_secret]
    h = hashlib.sha256()
    for f in fields:
        h.update(len(f).to_bytes(4, "big"))
        h.update(f)
    return h.digest()


def mask_stream(seed: bytes, length: int, prg: str = "shake-256") -> np.ndarray:
    """Expand a 32-byte seed into ``length`` uniform elements of Z/2^64 with a cryptographic PRG.

    ``shake-256`` (standard library, ~250 MB/s) or ``aes-256-ctr`` (``cryptography``, several GB/s
    with AES-NI; the seed is the key, the counter starts at 0, which is safe because every seed is
    used for one stream only).
    """
    nbytes = 8 * length
    if prg == "shake-256":
        raw = hashlib.shake_256(seed).digest(nbytes)
    elif prg == "aes-256-ctr":
        from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

        encryptor = Cipher(algorithms.AES(seed), modes.CTR(bytes(16))).encryptor()
        raw = encryptor.update(bytes(nbytes)) + encryptor.finalize()
    else:
        raise ValueError(f"unknown mask PRG {prg!r}")
    return np.frombuffer(raw, dtype="<u8").astype(np.uint64)


# --------------------------------------------------------------------------------------------
# Protocol participants
# --------------------------------------------------------------------------------------------


class Party:
    """One data party: holds its encoded vector and its secret key, and releases only a masked vector.

    There is deliberately no accessor for the vector; ``repr`` shows the id only.
    """

    __slots__ = ("party_id", "public_key", "_secret", "_encoded", "_scheme")

    def __init__(
        self,
        party_id: int,
        values: np.ndarray,
        codec: FixedPointCodec,
        key_agreement: KeyAgreement | None = None,
        random_bytes: RandomBytes | None = None,
    ) -> None:
        self.party_id = _check_party_id(party_id)
        self._encoded = codec.encode(values)
        self._scheme = key_agreement or default_key_agreement()
        self._secret, self.public_key = self._scheme.generate(random_bytes or secrets.token_bytes)

    def __repr__(self) -> str:
        return f"Party(party_id={self.party_id}, scheme={self._scheme.name!r})"

    @property
    def length(self) -> int:
        """Length of the vector (public: all parties vote on the same synthetic set)."""
        return int(self._encoded.size)

    def masked_vector(self, roster: Mapping[int, bytes], session: bytes) -> np.ndarray:
        """Return encode(values) + sum_{j>i} PRG(s_ij) - sum_{j<i} PRG(s_ij) (mod 2^64)."""
        if roster.get(self.party_id) != self.public_key:
            raise SecureAggregationError(f"party {self.party_id} is not in the settled roster")
        masked = self._encoded.copy()
        for other, public in roster.items():
            if other == self.party_id:
                continue
            shared = self._scheme.agree(self._secret, public)
            seed = pair_seed(shared, session, self._scheme.name, self.party_id, other)
            mask = mask_stream(seed, self.length, self._scheme.prg)
            if other > self.party_id:
                masked += mask  # uint64 arithmetic wraps: this is addition mod 2^64
            else:
                masked -= mask
        return masked

    def advertise(self, server: AggregationServer) -> None:
        """Round 0: send the public key to the server."""
        server.register(self.party_id, self.public_key)

    def contribute(self, server: AggregationServer) -> None:
        """Round 1: fetch the settled roster, mask, and send the masked vector."""
        server.submit(self.party_id, self.masked_vector(server.roster, server.session))


class AggregationServer:
    """The untrusted aggregator: sees public keys and masked vectors, learns only their sum.

    It stores nothing but public keys and uint64 masked vectors; it never holds a party's encoded
    or float vector.
    """

    def __init__(
        self, codec: FixedPointCodec, length: int, min_parties: int = 2, session: bytes | None = None
    ) -> None:
        if min_parties < 2:
            raise ValueError("min_parties must be >= 2 (a 'sum' of one party would reveal it)")
        if min_parties > codec.n_terms:
            raise ValueError("min_parties exceeds the number of terms the codec was sized for")
        self.codec = codec
        self.length = int(length)
        self.min_parties = int(min_parties)
        self.session = session if session is not None else secrets.token_bytes(_SESSION_BYTES)
        self._public_keys: dict[int, bytes] = {}
        self._roster: Mapping[int, bytes] | None = None
        self._masked: dict[int, np.ndarray] = {}

    def register(self, party_id: int, public_key: bytes) -> None:
        """Accept a public key before the roster is settled."""
        pid = _check_party_id(party_id)
        if self._roster is not None:
            raise SecureAggregationError(f"party {pid} registered after the roster was settled")
        if pid in self._public_keys:
            raise SecureAggregationError(f"party {pid} registered twice")
        if len(self._public_keys) >= self.codec.n_terms:
            raise SecureAggregationError("more parties than the fixed-point codec was sized for")
        self._public_keys[pid] = bytes(public_key)

    def settle(self) -> Mapping[int, bytes]:
        """Freeze the roster (who takes part) and return it for broadcast to the parties."""
        if self._roster is not None:
            raise SecureAggregationError("roster already settled")
        if len(self._public_keys) < self.min_parties:
            raise SecureAggregationError(
                f"only {len(self._public_keys)} parties registered, at least {self.min_parties} needed"
            )
        self._roster = MappingProxyType(dict(sorted(self._public_keys.items())))
        logger.info("secure aggregation: roster settled with %d parties", len(self._roster))
        return self._roster

    @property
    def roster(self) -> Mapping[int, bytes]:
        """The settled roster (party id -> public key)."""
        if self._roster is None:
            raise SecureAggregationError("roster not settled yet")
        return self._roster

    def submit(self, party_id: int, masked: np.ndarray) -> None:
        """Accept one masked vector from a roster member."""
        pid = _check_party_id(party_id)
        if pid not in self.roster:
            raise SecureAggregationError(f"party {pid} is not in the settled roster")
        if pid in self._masked:
            raise SecureAggregationError(f"party {pid} submitted twice")
        arr = np.asarray(masked)
        if arr.dtype != np.uint64 or arr.shape != (self.length,):
            raise SecureAggregationError(f"party {pid} sent a malformed masked vector")
        self._masked[pid] = arr.copy()

    def missing(self) -> list[int]:
        """Roster members whose masked vector has not arrived."""
        return [pid for pid in self.roster if pid not in self._masked]

    def aggregate_ring(self) -> np.ndarray:
        """The exact sum in Z/2^64 of all encoded vectors; refuses if anyone dropped out."""
        missing = self.missing()
        if missing:
            raise SecureAggregationError(
                f"parties {missing} dropped out after key agreement; their pairwise masks cannot be "
                "removed (dropout recovery is not implemented), so the sum is unrecoverable. "
                "Restart the aggregation without them."
            )
        total = np.zeros(self.length, dtype=np.uint64)
        for vec in self._masked.values():
            total += vec
        return total

    def aggregate(self) -> np.ndarray:
        """The decoded float sum of all parties' vectors."""
        return self.codec.decode(self.aggregate_ring())


def secure_sum(
    parties: list[Party], server: AggregationServer, dropped: frozenset[int] = frozenset()
) -> np.ndarray:
    """Run the protocol end to end in one process; ``dropped`` simulates parties that never send.

    Why a helper: keeps the round structure (advertise, settle, contribute, aggregate) in one place.
    """
    for party in parties:
        party.advertise(server)
    server.settle()
    for party in parties:
        if party.party_id not in dropped:
            party.contribute(server)
    return server.aggregate()


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
) -> np.ndarray:
    """One party's work before masking: vote on its own records, then add its noise share."""
    near, far = clean_histograms(emb, labels, synth_emb, synth_labels, q)
    local = np.concatenate([np.asarray(near, dtype=np.float64), np.asarray(far, dtype=np.float64)])
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


def federated_noisy_votes(
    private_emb: np.ndarray,
    private_labels: np.ndarray,
    parties: np.ndarray,
    synth_emb: np.ndarray,
    synth_labels: np.ndarray,
    q: int,
    sigma: float,
    noise: PartyNoise | None,
    mode: NoiseMode = "exact",
    tolerance: int = 0,
    *,
    n_parties: int | None = None,
    scale_bits: int = DEFAULT_SCALE_BITS,
    key_agreement: KeyAgreement | None = None,
) -> tuple[NoisyVotes, dict[str, Any]]:
    """Algorithm 2's voting step: local votes + local noise shares, summed by secure aggregation.

    Returns ``(NoisyVotes, report)``. The votes are the sum over parties of their clean
    histograms plus the sum of their noise shares (variance sigma^2 in paper mode, L/(L-t) sigma^2
    in exact mode). ``noise(party_id)`` is that party's noise generator: in a deployment each
    party's own secret; in simulation derived from the run's secret key, the round and the party
    (never a short or public seed: the server could replay it). ``n_parties`` makes every party of
    the roster take part, also those holding no record. ``sigma = 0`` is accepted for tests only
    (no privacy) and logged as a warning.
    """
    private_emb = np.asarray(private_emb)
    private_labels = np.asarray(private_labels)
    ids = _party_ids(parties, len(private_emb), n_parties)
    n_parties = int(ids.size)
    std = party_noise_std(sigma, n_parties, mode, tolerance)
    if sigma == 0:
        logger.warning("federated voting with sigma = 0: the aggregated votes are NOT differentially private")
    n_synth = len(synth_emb)
    codec = FixedPointCodec(scale_bits=scale_bits, n_terms=n_parties)
    server = AggregationServer(codec, length=2 * n_synth, min_parties=max(2, n_parties - tolerance))
    scheme = key_agreement or default_key_agreement()

    members = []
    for pid in ids.tolist():
        own = np.asarray(parties) == pid
        rng = noise(pid) if noise is not None else np.random.default_rng()
        local = _local_noisy_histograms(
            private_emb[own], private_labels[own], synth_emb, synth_labels, q, std, rng
        )
        members.append(Party(pid, local, codec, key_agreement=scheme))
    logger.info(
        "federated voting: %d parties, %d synthetic samples, scheme %s", n_parties, n_synth, scheme.name
    )
    total = secure_sum(members, server)

    votes = NoisyVotes(h_near=total[:n_synth], h_far=total[n_synth:], sigma=float(sigma), q=int(q))
    return votes, _report(codec, scheme, federated_guarantee(sigma, n_parties, mode, tolerance))


def _report(codec: FixedPointCodec, scheme: KeyAgreement, guarantee: dict[str, Any]) -> dict[str, Any]:
    """The manifest entry of one federated aggregation: public parameters only (no party sizes,
    which are exact statistics of the private data)."""
    return {
        **guarantee,
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
