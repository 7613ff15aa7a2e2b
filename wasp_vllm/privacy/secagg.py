"""Secure aggregation: the server learns the sum of the parties' vectors and nothing else.

It follows the pairwise-additive-mask construction of Bonawitz et al. 2016
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
  with fewer than ``min_parties``, which federated voting sets to ``L - tolerance`` so that
  the noise of the remaining parties still reaches sigma^2 in ``exact`` mode.

Threat model: an honest-but-curious server (it follows the protocol; it does not forge rosters or
keys), and honest-but-curious parties. The DP guarantee of the released sum comes from the noise;
secure aggregation only ensures that nothing *less* noisy than the sum is ever revealed.
"""

from __future__ import annotations

import logging
import math
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

import numpy as np

from wasp_vllm.privacy.key_agreement import (
    KeyAgreement,
    RandomBytes,
    SecureAggregationError,
    default_key_agreement,
    mask_stream,
    pair_seed,
)

logger = logging.getLogger(__name__)

RING_BITS = 64
DEFAULT_SCALE_BITS = 24
_SESSION_BYTES = 16


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


def _check_party_id(party_id: int) -> int:
    """Party ids are non-negative ints below 2^63: they order the pairs and enter the KDF."""
    if isinstance(party_id, bool) or not isinstance(party_id, (int, np.integer)):
        raise TypeError("party ids must be integers")
    pid = int(party_id)
    if not 0 <= pid < 2**63:
        raise ValueError("party ids must be in [0, 2^63)")
    return pid


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
        logger.debug("secure aggregation: roster settled with %d parties", len(self._roster))
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
