"""Helpers for tests of the privacy boundary: distinctive private records and leak detectors.

A leak check that looks for an upper-case canary prefix misses a record logged lower-cased, cut,
re-wrapped or compressed inside a Parquet file.  These helpers normalise case and whitespace,
look for *any* window of ``width`` characters of each record, and read Parquet and JSON files
as data before searching them.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

SYLLABLES = [a + b for a in "bdfgklmnprstvz" for b in "aeiou"]


def private_texts(n: int, seed: int = 0, words: int = 9) -> list[str]:
    """``n`` distinctive records of made-up words: no window of one can appear by chance elsewhere."""
    rng = np.random.default_rng(seed + 7919)
    return [
        f"Record{i} " + " ".join("".join(rng.choice(SYLLABLES, size=3)) for _ in range(words))
        for i in range(n)
    ]


def _normal(text: str) -> str:
    return "".join(text.casefold().split())


def leaks(blob: str, records: Sequence[str], width: int = 16) -> list[str]:
    """The records of which some ``width``-character window (case and whitespace ignored) is in ``blob``."""
    haystack = _normal(blob)
    found = []
    for record in records:
        needle = _normal(record)
        windows = {needle[i : i + width] for i in range(max(1, len(needle) - width + 1))}
        if any(w in haystack for w in windows):
            found.append(record)
    return found


def file_text(path: Path) -> str:
    """What a file holds as text: Parquet tables (values and metadata) and JSON read as data."""
    if path.suffix == ".parquet":
        table = pq.read_table(path)
        meta = {
            k.decode("utf-8", "replace"): v.decode("utf-8", "replace")
            for k, v in (table.schema.metadata or {}).items()
        }
        values = [
            str(v)
            for name in table.column_names
            if name != "embedding"
            for v in table.column(name).to_pylist()
        ]
        return "\n".join([*values, json.dumps(meta)])
    return path.read_bytes().decode("utf-8", "replace")


def assert_no_leak(blobs: Iterable[tuple[str, str]], records: Sequence[str]) -> None:
    """``blobs`` are ``(where, text)`` pairs; fail naming the first place that holds a record."""
    for where, text in blobs:
        found = leaks(text, records)
        assert not found, f"a private record leaked into {where}: {found[0][:12]}..."


def files_of(folder: Path) -> list[tuple[str, str]]:
    return [(str(p), file_text(p)) for p in sorted(folder.rglob("*")) if p.is_file()]
