"""Labelled record sets (private or test): validated against a task, and the records that vote.

Privacy rule for this module: the texts, labels and attributes held here may be private.  Error
messages and log lines name files, columns and counts, never a cell value; :class:`PrivateSet`
has a repr that shows counts only.  Reading files is :mod:`wasp_vllm.data.sources`.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
import pyarrow as pa

from wasp_vllm.data.resolve import source_table
from wasp_vllm.data.sources import DataError
from wasp_vllm.privacy.logs import debug_private
from wasp_vllm.privacy.sampling import assign_parties, bound_contributions, select_top_m
from wasp_vllm.privacy.secrets import keyed_fingerprint, owner_key, record_bytes
from wasp_vllm.tasks.spec import TaskSpec, normalize_label_key

__all__ = [
    "DataError",
    "PrivateSet",
    "draw_records",
    "load_private",
    "load_test",
    "table_to_set",
    "with_parties",
]

logger = logging.getLogger(__name__)

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
    parties: np.ndarray | None = None

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
        if self.parties is not None:
            self.parties = np.asarray(self.parties, dtype=np.int64).reshape(-1)
            if self.parties.shape[0] != n:
                raise DataError(f"PrivateSet: {n} texts but {self.parties.shape[0]} party ids")

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
            parties=None if self.parties is None else self.parties[idx],
        )

    def records(self) -> list[bytes]:
        """Each record (text, label, attribute, user) as canonical bytes, for keyed hashes."""
        return [
            record_bytes(
                [
                    self.texts[i],
                    self.label_names[int(self.labels[i])],
                    None if self.attributes is None else self.attributes[i],
                    None if self.users is None else self.users[i],
                ]
            )
            for i in range(len(self))
        ]

    def fingerprint(self, key: bytes | None = None) -> str:
        """Keyed fingerprint (HMAC-SHA256) of the multiset of records, independent of their order.

        The key defaults to the owner's secret (:func:`~wasp_vllm.privacy.secrets.owner_key`):
        the owner can compare two runs' fingerprints, nobody else can test a guess of the data.
        It belongs in the operator's files only, never in a published one.
        """
        return keyed_fingerprint(self.records(), self.label_names, owner_key() if key is None else key)


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


def _refuse(source: str, rows: list[int], problem: str) -> None:
    """Stop on malformed records with a line that states no count: how many records are bad, or
    how many the file holds, is a fact about the private file, and the line may be pasted anywhere.
    Which records they are goes to the DEBUG log, marked private, for the operator."""
    first = [i + 1 for i in rows[:20]]
    debug_private(
        logger, "%s: %d malformed records, at record no. %s (1 = first; 20 at most)", source, len(rows), first
    )
    raise DataError(f"{source}: {problem}; fix or remove such records (-v lists which)")


def _is_bytes(kind: pa.DataType) -> bool:
    return pa.types.is_binary(kind) or pa.types.is_large_binary(kind)


def _texts(table: pa.Table, col: str, source: str) -> list[str]:
    values = table.column(col).to_pylist()
    texts = ["" if v is None else str(v) for v in values]
    bad = [i for i, v in enumerate(values) if v is None or not str(v).strip()]
    if bad:
        _refuse(source, bad, f"a record has a null or empty text in column {col!r}")
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
    unknown = []
    for i, value in enumerate(values):
        label = None if value is None else mapping.get(_label_key(value))
        if label is None:
            unknown.append(i)
        else:
            out[i] = index[label]
    if unknown:
        _refuse(
            source,
            unknown,
            f"a record has a label in column {col!r} that is not a label of task '{task.name}' "
            f"(expected one of {task.labels}, or their aliases)",
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
    missing = [i for i, v in enumerate(values) if v is None or str(v).strip() == ""]
    if missing:
        _refuse(source, missing, f"a record has no user id in column {col!r}")
    return np.asarray(values)


@dataclass(frozen=True)
class Columns:
    """Which column of a file holds what: text and label, and optionally attribute and user id."""

    text: str = "text"
    label: str = "label"
    attribute: str | None = None
    user: str | None = None


def _table_and_columns(source: str, split: str, columns: Columns) -> tuple[pa.Table, Columns]:
    """The table of a file or built-in set, and its columns: a built-in's own, else ``columns``."""
    table, builtin = source_table(source, split)
    if builtin is None:
        return table, columns
    return table, Columns(builtin.text_col, builtin.label_col, builtin.attribute_col)


def table_to_set(table: pa.Table, task: TaskSpec, source: str, columns: Columns = Columns()) -> PrivateSet:
    """Validate an Arrow table against ``task`` and turn it into a PrivateSet."""
    c = columns
    _require_columns(
        table, source, {"text": c.text, "label": c.label, "attribute": c.attribute, "user": c.user}
    )
    if table.num_rows == 0:
        raise DataError(f"{source}: the table has no records")
    data = PrivateSet(
        texts=_texts(table, c.text, source),
        labels=_labels(table, c.label, task, source),
        label_names=list(task.labels),
        attributes=_attributes(table, c.attribute) if c.attribute else None,
        users=_users(table, c.user, source) if c.user else None,
    )
    empty = [name for name, count in zip(task.labels, data.label_counts(), strict=True) if count == 0]
    if empty:  # allowed: such a label is still generated, but nothing real votes for its samples
        debug_private(logger, "%s: labels with no records: %s", source, ", ".join(empty))
    return data


# ----- which records take part ------------------------------------------------------------------


def draw_records(data: PrivateSet, m: int | None, seed: int, cap: int | None = None) -> PrivateSet:
    """The records that vote: at most ``cap`` per unit, then the ``m`` of smallest keyed hash.

    Units are the users when ``data`` has them, else the parties (see
    :mod:`wasp_vllm.privacy.sampling` for why each rule looks at one record or unit alone).
    """
    if cap is not None:
        units = data.users if data.users is not None else data.parties
        if units is None:
            raise DataError("a cap on records per user needs user ids (--user-col) or parties (--parties)")
        data = data.subset(bound_contributions(data.records(), units.tolist(), cap, seed))
    if m is not None:
        if m <= 0:
            raise DataError(f"limit must be a positive number of records, got {m}")
        data = data.subset(select_top_m(data.records(), m, seed))
    return data


def with_parties(data: PrivateSet, n_parties: int, alpha: float, seed: int) -> PrivateSet:
    """``data`` with a federated party id per record (from its label and its own keyed hash)."""
    try:
        parties = assign_parties(data.records(), data.labels, len(data.label_names), n_parties, alpha, seed)
    except ValueError as exc:
        raise DataError(str(exc)) from None
    return PrivateSet(data.texts, data.labels, data.label_names, data.attributes, data.users, parties)


# ----- public loaders ----------------------------------------------------------------------------


def load_private(
    source: str,
    task: TaskSpec,
    columns: Columns = Columns(),
    limit: int | None = None,
    seed: int = 0,
    cap: int | None = None,
) -> PrivateSet:
    """Load the private set from a file, or a built-in set (``NAME`` is its ``fit`` split).

    A built-in name without a split reads ``fit``, the train split minus the validation records
    that every default was chosen on, so a demo's private set never holds what a choice saw
    (``NAME:train`` still reads the whole split).  For a built-in the columns are fixed (drugs:
    review -> text, rating -> label, condition -> attribute) and ``columns`` is ignored.  ``limit``
    keeps the ``limit`` records of smallest keyed hash (seeded), so that the
    small-M setting of the paper (e.g. M=100) can be reproduced from a larger
    file; ``cap`` first keeps at most that many records per user.
    """
    table, columns = _table_and_columns(source, "fit", columns)
    data = table_to_set(table, task, str(source), columns)
    data = draw_records(data, limit, seed, cap)
    debug_private(
        logger, "private set from %s: %d records over %d labels", source, len(data), len(task.labels)
    )
    return data


def load_test(
    source: str, task: TaskSpec, columns: Columns = Columns(), table: pa.Table | None = None
) -> PrivateSet:
    """Load a labelled test set from a file, a built-in set (its test split), or ``table`` (in-memory
    records, named ``source`` in messages)."""
    if table is None:
        table, columns = _table_and_columns(source, "test", columns)
    data = table_to_set(table, task, str(source), replace(columns, user=None))  # no users in a test set
    logger.info("test set from %s: %d records", source, len(data))
    return data
