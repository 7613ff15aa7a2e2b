"""The run directory: Arrow schema, atomic Parquet/JSON writes, checksummed checkpoints.

Layout of ``--out``::

    synthetic.parquet               PUBLISHED: the final output (all rounds)
    README.md                       PUBLISHED: the data set's card (Hugging Face format)
    manifest.json                   PUBLISHED: what the run did and spent; written last
    private/                        the operator's working files (mode 0700): NEVER share
        README.txt                  says so
        state.json                  weights, pools, ledger, checksums, keyed data fingerprint
        rounds/round-000.parquet    one file per finished round (with embeddings)
        rounds/votes-000.parquet    the noisy votes of each voting round
        noise.key                   the secret of the DP noise (mode 0600), deleted when the run ends
        engines.log                 what the engines' libraries printed (vLLM, transformers, ...)
    .wasp-vllm.lock                 held (flock) by the process writing the folder: one run at a time

What may be published is a function of the noisy votes or independent of the private data; the
``private/`` folder holds the secret key and the operator's bookkeeping, so it stays behind.
Every file is written to a temporary name, fsynced and renamed, so a kill at any moment leaves
either the old file or the new one, never half of one.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from wasp_vllm.pipeline.state import STATE_FORMAT, RunState
from wasp_vllm.privacy.secrets import OPERATOR_DIR, RECORD_KEYS_FILE, RecordKeys, RunSecret, check_key_mode
from wasp_vllm.privacy.voting import NoisyVotes

PUBLISHED = ("synthetic.parquet", "manifest.json", "README.md")  # README.md: the data set's card
RUN_FILES = (*PUBLISHED, OPERATOR_DIR)
KEY_FILE = "noise.key"
ENGINE_LOG = "engines.log"
#: Held with ``flock`` by the one process writing the folder; the kernel drops it when that process
#: ends, however it ends, so a lock left by a dead run never blocks.  Not a run file: an overwrite
#: keeps it, and publishing copies only :data:`PUBLISHED`.
LOCK_FILE = ".wasp-vllm.lock"
OPERATOR_README = """\
These are the operator's working files of a wasp-vllm run. NEVER share them.

noise.key is the secret of the differential-privacy noise: with it anyone can remove the noise.
It is deleted when the run finishes (a finished run does not need it to write its files again).
state.json and rounds/ are checkpoints for --resume (they hold a keyed fingerprint of the
private data and every intermediate sample); record_keys.json holds a keyed hash of each private
text (so that `evaluate --reference-public` can tell a reference that shares one); engines.log
holds what the engines' libraries printed while the run ran.
Share only ../synthetic.parquet, ../manifest.json, ../README.md (the data set's card) and the
report written by `wasp-vllm report`.
"""
# What _atomic_write's mkstemp(prefix=f".{name}.") calls its temporary files.
_TEMP_NAME = re.compile(
    r"\.(state\.json|manifest\.json|README\.md|synthetic\.parquet|noise\.key|record_keys\.json"
    r"|(round|votes)-\d+\.parquet)"
    r"\.[A-Za-z0-9_]{8}"
)


class CheckpointError(RuntimeError):
    """A run directory that cannot be used as it is (other run, corruption)."""


def sample_schema(dim: int | None = None) -> pa.Schema:
    """The data contract between stages: one record per synthetic sample."""
    fields = [
        pa.field("id", pa.string(), nullable=False),
        pa.field("text", pa.string(), nullable=False),
        pa.field("label", pa.string(), nullable=False),
        pa.field("attribute", pa.string()),
        pa.field("plm", pa.string(), nullable=False),
        pa.field("round", pa.int32(), nullable=False),
        pa.field("prompt_kind", pa.string(), nullable=False),
    ]
    if dim is not None:
        fields.append(pa.field("embedding", pa.list_(pa.float32(), dim)))
    return pa.schema(fields)


def stored_embeddings(samples: pa.Table) -> np.ndarray:
    """[rows, dim] float32: the embeddings a sample table (``sample_schema(dim)``) holds."""
    flat = np.asarray(samples.column("embedding").combine_chunks().flatten(), dtype=np.float32)
    return flat.reshape(samples.num_rows, samples.schema.field("embedding").type.list_size)


def _atomic_write(path: Path, write: Callable[[Path], object], mode: int = 0o644) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        os.chmod(tmp, mode)
        write(tmp)
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def write_parquet(path: Path, table: pa.Table) -> str:
    """Write atomically and return the file's sha256."""
    _atomic_write(path, lambda tmp: pq.write_table(table, tmp, compression="zstd"))
    return sha256_file(path)


def write_json(path: Path, data: dict[str, Any]) -> None:
    _atomic_write(path, lambda tmp: tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n"))


def write_private_json(path: Path, data: dict[str, Any]) -> None:
    """As :func:`write_json`, readable by its owner only (the operator's figures)."""
    text = json.dumps(data, indent=2, sort_keys=True, default=str) + "\n"
    _atomic_write(path, lambda tmp: tmp.write_text(text), mode=0o600)


def write_text(path: Path, text: str) -> None:
    _atomic_write(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))


class RunStore:
    """Reads and writes one run directory."""

    def __init__(self, out: str | Path) -> None:
        self.out = Path(out)
        self.private = self.out / OPERATOR_DIR
        self._lock: int | None = None  # the lock file's descriptor while this store holds it

    @property
    def lock_path(self) -> Path:
        return self.out / LOCK_FILE

    def round_path(self, t: int) -> Path:
        return self.private / "rounds" / f"round-{t:03d}.parquet"

    def votes_path(self, t: int) -> Path:
        return self.private / "rounds" / f"votes-{t:03d}.parquet"

    @property
    def state_path(self) -> Path:
        return self.private / "state.json"

    @property
    def record_keys_path(self) -> Path:
        return self.private / RECORD_KEYS_FILE

    def save_record_keys(self, keys: RecordKeys) -> None:
        """The keyed hashes of the private texts (owner-only), for ``evaluate --reference-public``."""
        write_private_json(self.record_keys_path, keys.to_json())

    @property
    def key_path(self) -> Path:
        return self.private / KEY_FILE

    @property
    def engine_log_path(self) -> Path:
        """What the engines' libraries print while the run works (:mod:`wasp_vllm.engines.chatter`)."""
        return self.private / ENGINE_LOG

    def finished(self) -> dict[str, Any] | None:
        """The published manifest of a run that finished, when its files are all there and its
        synthetic file is the one it describes (its noise key deleted, if a kill left it); else
        None: a run whose files are to be written again."""
        path = self.out / "manifest.json"
        try:
            manifest = json.loads(path.read_text())
            expected = manifest["output"]["sha256"]
        except (OSError, ValueError, KeyError, TypeError):
            return None
        if not all((self.out / name).is_file() for name in PUBLISHED):
            return None
        if sha256_file(self.out / "synthetic.parquet") != expected:
            return None
        self.discard_key()
        return dict(manifest)

    def has_run(self) -> bool:
        return any((self.out / name).exists() for name in RUN_FILES)

    def check(self, *, resume: bool, overwrite: bool) -> None:
        """Refuse to mix runs (an existing run is continued or removed only when asked); changes nothing."""
        if self.out.exists() and not self.out.is_dir():
            raise CheckpointError(f"--out {self.out} exists and is not a directory")
        if self._lock is None and self.lock_path.exists():  # busy: say so before anything else
            self._release(self._acquire())
        if self.has_run() and not (resume or overwrite):
            raise CheckpointError(
                f"{self.out} already holds a run; pass --resume to continue it or --overwrite to replace it"
            )

    def prepare(self, *, resume: bool, overwrite: bool) -> None:
        """Lock the folder, :meth:`check`, then clear it for an overwrite and remove stale temporary
        files.  The lock comes first: a second run on a busy folder stops before it changes anything
        (two runs writing one folder mixed their rows, or spent the budget of a round twice)."""
        if self._lock is None and (self.out.is_dir() or not self.out.exists()):  # a file: check says so
            self.out.mkdir(parents=True, exist_ok=True)
            self._lock = self._acquire()
        self.check(resume=resume, overwrite=overwrite)
        if overwrite and not resume:
            for name in RUN_FILES:
                target = self.out / name
                if target.is_dir():
                    shutil.rmtree(target)
                else:
                    target.unlink(missing_ok=True)
        for stale in self.stale_temp_files():  # left by a kill in the middle of a write
            stale.unlink(missing_ok=True)
        self.private.mkdir(parents=True, exist_ok=True)
        os.chmod(self.private, 0o700)
        readme = self.private / "README.txt"
        if not readme.exists():
            _atomic_write(readme, lambda tmp: tmp.write_text(OPERATOR_README))

    @contextmanager
    def prepared(self, *, resume: bool, overwrite: bool) -> Iterator[None]:
        """:meth:`prepare`, and the folder stays this run's until the block ends, however it ends."""
        try:
            self.prepare(resume=resume, overwrite=overwrite)
            yield
        finally:
            self.unlock()

    def __del__(self) -> None:  # a store dropped while it holds the lock frees the folder too
        self.unlock()

    def unlock(self) -> None:
        """Let another run use the folder (the process ending does the same)."""
        if self._lock is not None:
            self._release(self._lock)
            self._lock = None

    def _acquire(self) -> int:
        """The folder's lock, taken at once or refused: a run never waits for another."""
        fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise
            raise CheckpointError(
                f"{self.out} is busy: another wasp-vllm run is writing to it; wait for it to end "
                "or choose another --out"
            ) from None
        return fd

    @staticmethod
    def _release(fd: int) -> None:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)

    def stale_temp_files(self) -> list[Path]:
        """Temporary files of :func:`_atomic_write` that a killed process left behind."""
        folders = [self.out, self.private, self.private / "rounds"]
        return [p for d in folders if d.is_dir() for p in d.iterdir() if _TEMP_NAME.fullmatch(p.name)]

    def secret(self, noise_seed: int | None, *, create: bool) -> RunSecret:
        """The run's noise secret: from ``--noise-seed`` (tests), read back, or made once (0600).

        ``create=False`` (resuming a run that has voted) refuses to make a new key: a lost key
        would silently change the noise of the rounds still to come.
        """
        if noise_seed is not None:
            return RunSecret.from_noise_seed(noise_seed)
        if self.key_path.exists():
            check_key_mode(self.key_path, "the run's noise key")
            try:
                return RunSecret.from_text(self.key_path.read_text())
            except ValueError:
                raise CheckpointError(f"{self.key_path} is corrupted (not a noise key)") from None
        if not create:
            raise CheckpointError(f"{self.key_path} is missing: the run cannot resume without its noise key")
        secret = RunSecret.generate()
        _atomic_write(self.key_path, lambda tmp: tmp.write_text(secret.to_text()), mode=0o600)
        return secret

    @contextmanager
    def one_shot_secret(self) -> Iterator[RunSecret]:
        """A new noise secret for a run that never resumes (Hot PATE): its key file is deleted
        however the run ends."""
        secret = self.secret(None, create=True)
        try:
            yield secret
        finally:
            self.discard_key()

    def discard_key(self) -> None:
        """Delete the noise key of a finished run (one unlink: the key is there or gone).

        Nothing needs it once the published files are written (re-finishing a run reads only the
        checkpoints), and with it anyone holding the published noisy values could subtract the
        noise, e.g. get the exact private label proportions back from the label shares.
        """
        self.key_path.unlink(missing_ok=True)

    def save_state(self, state: RunState) -> None:
        data = state.to_dict()
        body = json.dumps(data, sort_keys=True)
        write_json(self.state_path, {"state": data, "sha256": hashlib.sha256(body.encode()).hexdigest()})

    def load_state(self) -> RunState | None:
        """The last finished round's state, verified; None when the run has not finished a round."""
        if not self.state_path.exists():
            return None
        try:
            wrapper = json.loads(self.state_path.read_text())
            state = wrapper["state"]
            body = json.dumps(state, sort_keys=True)
        except (ValueError, KeyError, TypeError):
            raise CheckpointError(f"{self.state_path} is corrupted (not a valid state file)") from None
        if hashlib.sha256(body.encode()).hexdigest() != wrapper.get("sha256"):
            raise CheckpointError(f"{self.state_path} is corrupted (checksum mismatch)")
        for name, digest in state["checksums"].items():
            path = self.private / "rounds" / name
            if not path.exists() or sha256_file(path) != digest:
                raise CheckpointError(f"checkpoint file rounds/{name} is missing or corrupted (checksum)")
        if state.get("format", 1) != STATE_FORMAT:
            raise CheckpointError(
                f"{self.state_path} was written by an earlier wasp-vllm whose settings have since changed "
                "(docs/research/levers-not-adopted.md), so it cannot be resumed; start the run again with "
                "--overwrite"
            )
        return RunState.from_dict(state)

    def read_round(self, t: int) -> pa.Table:
        return pq.read_table(self.round_path(t))

    def read_votes(self, t: int, sigma: float, q: int) -> NoisyVotes:
        """The noisy votes committed after round ``t`` (``sigma`` and ``q``: the run's plan's)."""
        table = pq.read_table(self.votes_path(t))
        far = table.column("h_far").to_numpy() if "h_far" in table.column_names else None
        return NoisyVotes(table.column("h_near").to_numpy(), far, sigma, q)
