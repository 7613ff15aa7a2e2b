"""The secrets of a run, and every value derived from them.

All DP noise comes from one secret per run, :class:`RunSecret`: 32 random bytes kept in the
operator's folder of the run (``private/noise.key``, mode 0600) so that ``--resume`` draws the
same noise again.  Each noise stream (a voting round, a federated party's share of a round, Hot
PATE's releases) is a generator derived from the secret and a label that names the stream, so no
two streams share randomness and none can be replayed without the key.

``--noise-seed`` (tests only) derives the secret from a small public integer: anyone who knows it
can subtract the noise, so a run with it carries a *void* privacy guarantee
(:attr:`RunSecret.fixed`).

Two keyed hashes live here too:

* :func:`owner_key` is a per-owner secret (``$WASP_VLLM_HOME/owner.key``, default
  ``~/.config/wasp-vllm``); the keyed fingerprint of a private data set is an HMAC under it, so the
  owner can see that two runs used the same records while nobody else can test a guess
  (a plain SHA-256 of the records would let anyone who knows all records but one tell which
  neighbouring data set was used).
* :func:`record_uniform` is a *public* keyed hash of one record (keyed by the run's public seed),
  used for rules that must look at one record alone: which records a ``--m`` draw keeps, which
  party holds a record, which of a user's records survive the contribution cap.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

log = logging.getLogger(__name__)

KEY_BYTES = 32
#: The folder of a run that holds the operator's own files (noise key, checkpoints, record keys):
#: never published (``pipeline/store.py`` writes it, ``publish`` leaves it out).
OPERATOR_DIR = "private"
#: In it, the keyed hashes of the private texts (:class:`RecordKeys`).
RECORD_KEYS_FILE = "record_keys.json"
_DOMAIN = b"wasp-vllm/v1/"


@dataclass(frozen=True, repr=False)
class RunSecret:
    """The secret key of one run; ``fixed`` when it was derived from a public ``--noise-seed``."""

    key: bytes
    fixed: bool = False

    def __repr__(self) -> str:  # never print the key
        return f"RunSecret(fixed={self.fixed})"

    @classmethod
    def generate(cls) -> RunSecret:
        return cls(secrets.token_bytes(KEY_BYTES))

    @classmethod
    def from_noise_seed(cls, seed: int) -> RunSecret:
        """A NOT secret key from a public integer (tests only: the run's epsilon is void)."""
        digest = hashlib.sha256(_DOMAIN + b"noise-seed/" + str(int(seed)).encode()).digest()
        return cls(digest, fixed=True)

    def derive(self, stream: str, *parts: int | str) -> bytes:
        """32 bytes for one named stream: HMAC-SHA256(key, stream and parts)."""
        message = _DOMAIN + json.dumps([stream, *parts]).encode()
        return hmac.new(self.key, message, hashlib.sha256).digest()

    def generator(self, stream: str, *parts: int | str) -> np.random.Generator:
        """A numpy generator seeded with 256 secret bits of one stream (e.g. ``("vote", t)``)."""
        return np.random.default_rng(
            np.random.SeedSequence(int.from_bytes(self.derive(stream, *parts), "big"))
        )

    def check_value(self) -> str:
        """A value that shows the same key is back on resume and reveals nothing of it."""
        return self.derive("key-check").hex()[:32]

    def to_text(self) -> str:
        return self.key.hex()

    @classmethod
    def from_text(cls, text: str) -> RunSecret:
        key = bytes.fromhex(text.strip())
        if len(key) != KEY_BYTES:
            raise ValueError("a noise key is 32 bytes in hex")
        return cls(key)


class KeyFileError(ValueError):
    """A key file that other users may read or write: refused, as ssh refuses such a private key."""


def check_key_mode(path: Path, what: str) -> None:
    """Refuse ``path`` when its group or other permission bits are set.

    Refused rather than warned about: a warning scrolls away, and a key others could read may
    already be known to them (the noise key then voids the guarantee of what it noised).  The
    fix is one ``chmod``; the message says so and names no secret.
    """
    if os.name != "posix":  # no Unix modes to check (Windows ACLs are another matter)
        return
    mode = path.stat().st_mode & 0o777
    if mode & 0o077:
        raise KeyFileError(
            f"{path}: {what} is accessible to other users (mode {mode:03o}); if anyone else could "
            f"have read it, treat it as leaked. Restrict it with: chmod 600 {path}"
        )


def owner_home() -> Path:
    """Where the owner's own secrets live (``WASP_VLLM_HOME`` overrides ``~/.config/wasp-vllm``)."""
    root = os.environ.get("WASP_VLLM_HOME") or Path.home() / ".config" / "wasp-vllm"
    return Path(root)


def owner_key() -> bytes:
    """The owner's fingerprint key, created (mode 0600) on first use."""
    path = owner_home() / "owner.key"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        tmp = path.with_name(f".owner.key.{os.getpid()}.{secrets.token_hex(4)}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(secrets.token_hex(KEY_BYTES))
        try:  # link, not rename: a key another process made first is never replaced
            os.link(tmp, path)
            log.debug("created the owner key %s", path)
        except FileExistsError:
            pass
        finally:
            tmp.unlink()
    check_key_mode(path, "the owner key")
    return bytes.fromhex(path.read_text().strip())


def record_bytes(fields: Sequence[object]) -> bytes:
    """A canonical byte string of one record's fields (text, label, attribute, user)."""
    return json.dumps([None if f is None else str(f) for f in fields], ensure_ascii=False).encode("utf-8")


def keyed_fingerprint(records: Sequence[bytes], label_names: Sequence[str], key: bytes) -> str:
    """HMAC-SHA256 under ``key`` of the multiset of records (order-independent)."""
    mac = hmac.new(key, _DOMAIN + b"fingerprint/" + json.dumps(list(label_names)).encode(), hashlib.sha256)
    for digest in sorted(hashlib.sha256(r).digest() for r in records):
        mac.update(digest)
    return "hmac-sha256:" + mac.hexdigest()


def keyed_name(name: str, key: bytes) -> str:
    """HMAC-SHA256 under ``key`` of a name (e.g. the private file's path as the user gave it): the
    owner sees that two runs name the same file; nobody else learns the path or can test a guess."""
    mac = hmac.new(key, _DOMAIN + b"name/" + name.encode("utf-8"), hashlib.sha256)
    return "hmac-sha256:" + mac.hexdigest()


@dataclass(frozen=True)
class RecordKeys:
    """Keyed hashes of the texts of a private data set, under the owner key (the operator's, kept in
    the run's ``private/``): ``evaluate --reference-public`` tells a reference that shares a record
    with the run's private data, however the file was copied or renamed, and nobody without the
    key can test a guess of a text.  ``key_id`` names the owner key they were made under."""

    key_id: str
    keys: frozenset[str]

    @classmethod
    def of(cls, texts: Sequence[str], key: bytes) -> RecordKeys:
        return cls(owner_key_id(key), frozenset(text_key(t, key) for t in texts))

    def shared_with(self, texts: Sequence[str], key: bytes) -> int:
        """How many of ``texts`` are texts of the private data (0: none); ``key`` must be the one
        the keys were made under (:attr:`key_id`)."""
        if owner_key_id(key) != self.key_id:
            raise ValueError("the record keys were made under another owner key")
        return sum(text_key(t, key) in self.keys for t in texts)

    def to_json(self) -> dict[str, object]:
        return {"key_id": self.key_id, "keys": sorted(self.keys)}

    @classmethod
    def of_run(cls, run_dir: Path) -> RecordKeys | None:
        """The keys a run kept in its operator folder; None where there are none (a published
        folder, a run from before they were kept) or the file is not one."""
        try:
            return cls.from_json(json.loads((run_dir / OPERATOR_DIR / RECORD_KEYS_FILE).read_text()))
        except (OSError, ValueError, KeyError, TypeError):
            return None

    @classmethod
    def from_json(cls, data: dict[str, object]) -> RecordKeys:
        keys = data["keys"]
        if not isinstance(keys, list):
            raise ValueError("record keys must be a list")
        return cls(str(data["key_id"]), frozenset(str(k) for k in keys))


def text_key(text: str, key: bytes) -> str:
    """HMAC-SHA256 under ``key`` of one text, case and spacing folded, 64 bits of it."""
    folded = " ".join(str(text).casefold().split())
    return hmac.new(key, _DOMAIN + b"text/" + folded.encode("utf-8"), hashlib.sha256).hexdigest()[:16]


def owner_key_id(key: bytes) -> str:
    """A name for an owner key that reveals nothing of it (to tell keys apart, never to test one)."""
    return hmac.new(key, _DOMAIN + b"key-id", hashlib.sha256).hexdigest()[:16]


def record_uniform(record: bytes, purpose: str, seed: int) -> float:
    """A number in [0, 1) that depends on this record, the purpose and the public seed only."""
    key = _DOMAIN + f"{purpose}/{int(seed)}".encode()
    digest = hashlib.blake2b(record, key=key[:64], digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2.0**64
