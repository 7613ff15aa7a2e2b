"""Issue 60, item 1: a custom task from the first try.

``wasp-vllm tasks --template NAME`` writes a commented task file that the task loader accepts as
written; a run on a task file needs its own records (``--private FILE``: the built-in drug reviews
are never used for a task they do not belong to); ``evaluate`` scores on the task the run's
manifest names, not on a default.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.test_cli_errors import assert_refused
from wasp_vllm.cli import app
from wasp_vllm.tasks import get_task
from wasp_vllm.tasks.prompts import build_prompt
from wasp_vllm.tasks.spec import PROMPT_KINDS
from wasp_vllm.tasks.template import task_template


def test_the_template_is_a_valid_task_as_written(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["tasks", "--template", "tickets"])
    assert result.exit_code == 0, result.output
    spec = get_task("tickets.toml")  # the loader --task uses
    assert spec.name == "tickets" and spec.labels == ["label_a", "label_b"]
    assert spec.alias_map()["first"] == "label_a"
    templates = spec.templates
    assert all(getattr(templates, kind).endswith('"') for kind in PROMPT_KINDS)
    text = Path("tickets.toml").read_text()
    assert text.count("\n#") >= 10  # commented: every section says what it is for
    check = CliRunner().invoke(app, ["tasks", "--check", "tickets.toml"])
    assert check.exit_code == 0 and "labels label_a, label_b" in check.output


def test_the_template_asks_for_attributes_and_they_work_once_uncommented(tmp_path):
    """Issue 75: the template recommends a public attribute; uncommenting its lines gives a task
    whose prompts ask for one of each label's values."""
    text = task_template("tickets")
    assert "Recommended: a public attribute" in text and get_task_from(tmp_path, text).attribute_name is None
    uncommented = re.sub(
        r"^# (attribute_name|attribute_template|\[label_attribute_values\]|label_[ab] = \[)",
        r"\1",
        text,
        flags=re.MULTILINE,
    )
    spec = get_task_from(tmp_path, uncommented)
    assert spec.attribute_name == "topic" and len(spec.attribute_choices("label_a")) == 3
    prompt = build_prompt(spec, "zero_shot", "label_a", attribute=spec.attribute_choices("label_a")[0])
    assert "about a first sub-topic that is the first kind" in prompt


def get_task_from(folder: Path, text: str):
    path = folder / "t.toml"
    path.write_text(text)
    return get_task(str(path))


def test_the_template_keeps_an_existing_file_and_refuses_a_bad_name(tmp_path):
    target = tmp_path / "mine.toml"
    target.write_text("keep me")
    result = CliRunner().invoke(app, ["tasks", "--template", "tickets", "--out", str(target)])
    assert_refused(result, "exists and is kept")
    assert target.read_text() == "keep me"
    assert_refused(CliRunner().invoke(app, ["tasks", "--template", "Bad Name"]), "lower case letters")
    with pytest.raises(ValueError, match="lower case"):
        task_template("Tickets")


def test_a_task_file_without_private_is_refused(tmp_path):
    """Without --private the default is the built-in drug reviews: refused for a task file, not run
    on data the user never named."""
    task = tmp_path / "tickets.toml"
    task.write_text(task_template("tickets"))
    argv = ["generate", "--task", str(task), "--n", "12", "--rounds", "2", "--s", "2", "--out",
            str(tmp_path / "out")]  # fmt: skip
    line = assert_refused(CliRunner().invoke(app, argv), "--private")
    assert "pass your own records with --private FILE" in line
    assert not (tmp_path / "out").exists()
    dry = assert_refused(CliRunner().invoke(app, [*argv, "--dry-run"]), "--private")
    assert dry == line


@pytest.fixture()
def scored(monkeypatch) -> dict:
    """What ``evaluate`` would score with (the scoring itself is other tests' subject)."""
    seen: dict = {}

    def stop(path, settings, **_):
        seen.update(settings.model_dump())
        raise ValueError("stopped before scoring")

    monkeypatch.setattr("wasp_vllm.evaluation.evaluate_synthetic", stop)
    return seen


def test_evaluate_takes_the_task_from_the_run(tmp_path, scored):
    run = tmp_path / "run"
    run.mkdir()
    (run / "synthetic.parquet").write_bytes(b"")
    (run / "manifest.json").write_text(json.dumps({"config": {"task": "tweets"}}))
    argv = ["evaluate", "--synthetic", str(run / "synthetic.parquet"), "--test", "test.csv"]
    assert_refused(CliRunner().invoke(app, argv), "stopped before scoring")
    assert scored["task"] == "tweets"
    assert_refused(CliRunner().invoke(app, [*argv, "--task", "imdb"]), "stopped before scoring")
    assert scored["task"] == "imdb"  # an explicit --task wins


def test_evaluate_without_a_manifest_asks_for_the_task(tmp_path, scored):
    synthetic = tmp_path / "synthetic.parquet"
    synthetic.write_bytes(b"")
    argv = ["evaluate", "--synthetic", str(synthetic), "--test", "drugs"]
    assert_refused(CliRunner().invoke(app, argv), "pass --task NAME or FILE")
    assert not scored
