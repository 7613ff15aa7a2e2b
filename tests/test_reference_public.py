"""``evaluate --reference-public`` (issue 57, item 4): a reference declared public is refused when it
is, or overlaps, the private data of the run that wrote the synthetic file (a built-in set or a
file, as the run's manifest names it), not only the ``--private`` passed alongside.  Its label
agreement is an un-noised statistic of its records: published, it would release private records.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.fakes import HashEmbedderForTests, use_fake_backends
from tests.test_reliability import write_private
from wasp_vllm.cli import app
from wasp_vllm.evaluation import evaluate_synthetic, runner
from wasp_vllm.evaluation.settings import EvalSettings
from wasp_vllm.pipeline.manifest import published_source


def _evaluate(synthetic: Path, test: Path, *extra: str):
    return CliRunner().invoke(app, ["evaluate", "--synthetic", str(synthetic), "--test", str(test), *extra])


def test_the_runs_own_private_file_cannot_be_declared_public(tmp_path, monkeypatch):
    use_fake_backends(monkeypatch)
    monkeypatch.setattr(runner, "_make_embedder", lambda spec: HashEmbedderForTests())
    monkeypatch.chdir(tmp_path)
    private, out = write_private(tmp_path / "private.csv", n=12), tmp_path / "run"
    argv = ["generate", "--plms", "a", "--private", "private.csv", "--n", "12", "--rounds", "2", "--q", "2",
            "--s", "2", "--out", str(out)]  # fmt: skip
    assert CliRunner().invoke(app, argv).exit_code == 0
    synthetic = out / "synthetic.parquet"
    for spelt in (str(private), "private.csv", f"../{tmp_path.name}/private.csv"):  # however it is spelt
        refused = _evaluate(synthetic, private, "--reference", spelt, "--reference-public")
        assert refused.exit_code == 2, refused.output
        (line,) = [x for x in refused.output.splitlines() if x.startswith("error:")]
        assert "overlaps the private data of the run" in line and "Traceback" not in refused.output
    # not declared public: the agreement goes to the operator's section, as before
    kept = _evaluate(synthetic, private, "--reference", str(private), "--out", str(tmp_path / "report.json"))
    assert kept.exit_code == 0, kept.output


def _built_in_run(tmp_path: Path, source: str) -> Path:
    """A run folder whose manifest names a built-in private set (only the manifest is read)."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "manifest.json").write_text(json.dumps({"config": {"private": published_source(source)}}))
    return run / "synthetic.parquet"


@pytest.mark.parametrize("reference", ["drugs", "drugs:fit", "drugs:train"])
def test_a_built_in_private_set_cannot_be_declared_public(tmp_path, reference):
    synthetic = _built_in_run(tmp_path, "drugs")
    scored = EvalSettings(test="drugs", reference=reference, reference_public=True)
    with pytest.raises(ValueError, match="overlaps the private data of the run"):
        evaluate_synthetic(synthetic, scored)


def test_another_split_passes_the_check_and_an_unknown_run_is_refused(tmp_path):
    synthetic = _built_in_run(tmp_path, "drugs")
    runner._check_declared_public("drugs:test", None, synthetic)  # the test split holds no fit record
    os.remove(synthetic.parent / "manifest.json")
    scored = EvalSettings(test="drugs", reference="drugs:test", reference_public=True)
    with pytest.raises(ValueError, match="no manifest.json beside"):
        evaluate_synthetic(synthetic, scored)
