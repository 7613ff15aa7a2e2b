"""Key agreement and pairwise masks of secure aggregation (see :mod:`.secagg`).

Each pair of parties derives a shared secret (X25519 when the ``cryptography`` package is
importable, else finite-field Diffie-Hellman over RFC 3526 group 14 in pure Python), hashes it
with the session id and the two party ids into a pair seed, and expands that seed with a
cryptographic PRG into a uniform mask vector over Z/2^64.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from functools import lru_cache
from typing import Any, Protocol

import numpy as np

RandomBytes = Callable[[int], bytes]
_KDF_DOMAIN = b"wasp-vllm/secagg/pair-seed/v1"


class SecureAggregationError(RuntimeError):
    """The secure-aggregation protocol cannot (or must not) proceed."""


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
