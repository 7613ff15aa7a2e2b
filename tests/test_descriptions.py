"""The label descriptions alone, beside every score (issue 76, item 5): each text gets the label
whose description is nearest in the embedder's space; ``evaluate`` reports it on the same test set
with one line that reads the synthetic set's macro-F1 against it.  ``HashEmbedderForTests`` (a
bag of words, named as such): a text that names its label phrase sits nearest that description.
"""

from __future__ import annotations

import json

import numpy as np
from typer.testing import CliRunner

from tests.fakes import HashEmbedderForTests, use_fake_backends
from tests.test_reliability import write_private
from wasp_vllm.cli import app
from wasp_vllm.evaluation import runner
from wasp_vllm.evaluation.descriptions import DescriptionsScore, descriptions_score
from wasp_vllm.tasks import get_task


def test_the_descriptions_label_what_names_them_and_read_a_score_beside_them():
    task, embedder = get_task("drugs"), HashEmbedderForTests()
    texts = [f"{task.label_text(label)} and a word or two" for label in task.labels] * 4
    labels = np.array(list(range(len(task.labels))) * 4)
    embedded = embedder.encode(texts)
    named = descriptions_score(task, embedder, embedded, labels)
    assert named.accuracy == 1.0 and named.macro_f1 == 1.0
    shuffled = descriptions_score(task, embedder, embedded, np.roll(labels, 1))
    assert shuffled.macro_f1 == 0.0
    score = DescriptionsScore(accuracy=0.7, macro_f1=0.6)
    assert "adds nothing here" in score.reading(0.55) and "-0.050" in score.reading(0.55)
    assert score.reading(0.7).startswith("above") and "+0.100" in score.reading(0.7)


def test_evaluate_reports_the_descriptions_beside_the_synthetic_set(tmp_path, monkeypatch):
    use_fake_backends(monkeypatch)
    monkeypatch.setattr(runner, "_make_embedder", lambda spec: HashEmbedderForTests())
    private = write_private(tmp_path / "p.csv", n=12)
    argv = ["generate", "--plms", "a", "--private", str(private), "--n", "12", "--rounds", "2", "--q", "2",
            "--s", "2", "--out", str(tmp_path / "run")]  # fmt: skip
    assert CliRunner().invoke(app, argv).exit_code == 0
    result = CliRunner().invoke(app, ["evaluate", "--synthetic", str(tmp_path / "run" / "synthetic.parquet"),
                                      "--test", str(private)])  # fmt: skip
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    alone = report["descriptions_only"]
    assert 0.0 <= alone["macro_f1"] <= 1.0 and report["reading"].split(" (")[0] in result.stderr
    gap = report["macro_f1"] - alone["macro_f1"]
    assert report["reading"].startswith("below" if gap < 0 else "above")
    assert f"{alone['macro_f1']:.3f}" in report["reading"]
