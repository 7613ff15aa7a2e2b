"""The run directory: Arrow schema, atomic Parquet/JSON writes, checksummed checkpoints.

Layout of ``--out``::

    rounds/round-000.parquet ...   one file per finished round (with embeddings)
    state.json                      weights, pools, ledger, checksums of the round files
    .noise-key                      secret seed of the DP noise (mode 0600; never publish)
    synthetic.parquet               the final output (all rounds)
    manifest.json                   what the run did and spent; written last

Every file is written to a temporary name, fsynced and renamed, so a kill at any
moment leaves either the old file or the new one, never half of one.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

RUN_FILES = ("state.json", "manifest.json", "synthetic.parquet", "rounds", ".noise-key")
# What _atomic_write's mkstemp(prefix=f".{name}.") calls its temporary files.
_TEMP_NAME = re.compile(
    r"\.(state\.json|manifest\.json|synthetic\.parquet|\.noise-key|round-\d+\.parquet)\.[A-Za-z0-9_]{8}"
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


def _atomic_write(path: Path, write: Callable[[Path], None], mode: int = 0o644) -> None:
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


class RunStore:
    """Reads and writes one run directory."""

    def __init__(self, out: str | Path) -> None:
        self.out = Path(out)

    def round_path(self, t: int) -> Path:
        return self.out / "rounds" / f"round-{t:03d}.parquet"

    @property
    def state_path(self) -> Path:
        return self.out / "state.json"

    def has_run(self) -> bool:
        return any((self.out / name).exists() for name in RUN_FILES)

    def check(self, *, resume: bool, overwrite: bool) -> None:
        """Refuse to mix runs (an existing run is continued or removed only when asked); changes nothing."""
        if self.out.exists() and not self.out.is_dir():
            raise CheckpointError(f"--out {self.out} exists and is not a directory")
        if self.has_run() and not (resume or overwrite):
            raise CheckpointError(
                f"{self.out} already holds a run; pass --resume to continue it or --overwrite to replace it"
            )

    def prepare(self, *, resume: bool, overwrite: bool) -> None:
        """:meth:`check`, then clear the directory for an overwrite and remove stale temporary files."""
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
        self.out.mkdir(parents=True, exist_ok=True)

    def stale_temp_files(self) -> list[Path]:
        """Temporary files of :func:`_atomic_write` that a killed process left behind."""
        folders = [self.out, self.out / "rounds"]
        return [p for d in folders if d.is_dir() for p in d.iterdir() if _TEMP_NAME.fullmatch(p.name)]

    def noise_key(self, fixed: int | None) -> int:
        """The DP noise seed: fixed (tests), else a secret kept beside the checkpoint for resume.

        A published seed would let anyone subtract the noise, so it is never put in
        the manifest or the state and its file is readable by the owner alone.
        """
        if fixed is not None:
            return fixed
        path = self.out / ".noise-key"
        if path.exists():
            try:
                return int(path.read_text().strip())
            except ValueError:
                raise CheckpointError(f"{path} is corrupted (not a noise key)") from None
        key = secrets.randbits(128)
        _atomic_write(path, lambda tmp: tmp.write_text(str(key)), mode=0o600)
        return key

    def _noise_key_digest(self) -> str | None:
        path = self.out / ".noise-key"
        return hashlib.sha256(path.read_bytes()).hexdigest() if path.exists() else None

    def save_state(self, state: dict[str, Any]) -> None:
        body = json.dumps(state, sort_keys=True)
        wrapper = {"state": state, "sha256": hashlib.sha256(body.encode()).hexdigest()}
        key = self._noise_key_digest()
        if key is not None:  # a lost or edited key would silently change the noise of later rounds
            wrapper["noise_key_sha256"] = key
        write_json(self.state_path, wrapper)

    def load_state(self) -> dict[str, Any] | None:
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
        for name, digest in state["round_sha256"].items():
            path = self.out / "rounds" / name
            if not path.exists() or sha256_file(path) != digest:
                raise CheckpointError(f"checkpoint file rounds/{name} is missing or corrupted (checksum)")
        if "noise_key_sha256" in wrapper and self._noise_key_digest() != wrapper["noise_key_sha256"]:
            raise CheckpointError(f"{self.out / '.noise-key'} is missing or corrupted (checksum)")
        return state

    def read_round(self, t: int) -> pa.Table:
        return pq.read_table(self.round_path(t))
