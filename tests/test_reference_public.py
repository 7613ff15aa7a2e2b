"""``evaluate --reference-public`` (issue 57, item 4; issue 73, item 3): a reference declared public
is refused when it shares a record with the private data of the run that wrote the synthetic file,
or with the ``--private`` passed alongside, however the file is spelt, copied or linked; and where
that cannot be checked (no record keys beside the run, keys under another owner key), the
declaration is refused too.  Its label agreement is an un-noised statistic of its records:
published, it would release private records.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

import wasp_vllm
from tests.fakes import HashEmbedderForTests, use_fake_backends
from tests.test_reliability import write_private
from wasp_vllm.cli import app
from wasp_vllm.evaluation import evaluate_synthetic, runner
from wasp_vllm.evaluation.settings import EvalSettings
from wasp_vllm.pipeline.manifest import published_source


def _evaluate(synthetic: Path, test: Path, *extra: str):
    return CliRunner().invoke(app, ["evaluate", "--synthetic", str(synthetic), "--test", str(test), *extra])


@pytest.fixture
def run_on_a_file(tmp_path, monkeypatch):
    """A finished run on ``private.csv`` (fake engines), from inside ``tmp_path``."""
    use_fake_backends(monkeypatch)
    monkeypatch.setattr(runner, "_make_embedder", lambda spec: HashEmbedderForTests())
    monkeypatch.chdir(tmp_path)
    private, out = write_private(tmp_path / "private.csv", n=12), tmp_path / "run"
    argv = ["generate", "--plms", "a", "--private", "private.csv", "--n", "12", "--rounds", "2", "--q", "2",
            "--s", "2", "--out", str(out)]  # fmt: skip
    assert CliRunner().invoke(app, argv).exit_code == 0
    return private, out / "synthetic.parquet"


def _refused(synthetic: Path, test: Path, reference: Path | str, why: str) -> None:
    refused = _evaluate(synthetic, test, "--reference", str(reference), "--reference-public")
    assert refused.exit_code == 2, refused.output
    (line,) = [x for x in refused.output.splitlines() if x.startswith("error:")]
    assert why in line and "Traceback" not in refused.output


def test_the_runs_own_private_file_cannot_be_declared_public(tmp_path, run_on_a_file):
    private, synthetic = run_on_a_file
    for spelt in (str(private), "private.csv", f"../{tmp_path.name}/private.csv"):  # however it is spelt
        _refused(synthetic, private, spelt, "shares records with the private data of the run")
    # not declared public: the agreement goes to the operator's section, as before
    kept = _evaluate(synthetic, private, "--reference", str(private), "--out", str(tmp_path / "report.json"))
    assert kept.exit_code == 0, kept.output


def test_a_copy_a_hard_link_or_a_part_of_the_private_file_cannot_be_declared_public(tmp_path, run_on_a_file):
    private, synthetic = run_on_a_file
    copy = shutil.copyfile(private, tmp_path / "elsewhere.csv")
    os.link(private, tmp_path / "linked.csv")
    part = tmp_path / "part.csv"  # two private records among public ones, upper-cased
    lines = private.read_text().splitlines()
    part.write_text("\n".join([lines[0], lines[3].upper().replace(",", " ,"), lines[5],
                               "a public review,positive", "another one,negative"]) + "\n")  # fmt: skip
    for reference in (copy, tmp_path / "linked.csv", part):
        _refused(synthetic, private, reference, "shares records with the private data of the run")


def test_a_public_reference_passes_and_the_check_is_said(tmp_path, run_on_a_file, caplog):
    private, synthetic = run_on_a_file
    public = tmp_path / "public.csv"
    public.write_text("text,label\na public review,positive\nanother one,negative\na third,neutral\n")
    caplog.set_level("INFO", logger="wasp_vllm.evaluation.reference")
    scored = EvalSettings(test=str(private), task="drugs", reference=str(public), reference_public=True)
    scores = evaluate_synthetic(synthetic, scored, embedder=HashEmbedderForTests())
    assert scores.label_agreement is not None  # published: the reference holds no private record
    assert "checked record by record" in caplog.text


def test_nothing_to_check_against_is_refused(tmp_path, run_on_a_file, monkeypatch):
    """A published folder (no private/ beside it), and a run whose keys were made under another
    owner key: nothing tells a private record, so the declaration is refused."""
    private, synthetic = run_on_a_file
    public = tmp_path / "public.csv"
    public.write_text("text,label\na public review,positive\n")
    monkeypatch.setenv("WASP_VLLM_HOME", str(tmp_path / "another-owner"))
    _refused(synthetic, private, public, "under another owner key")
    monkeypatch.delenv("WASP_VLLM_HOME")
    published = tmp_path / "shared"
    assert CliRunner().invoke(app, ["publish", str(synthetic.parent), str(published)]).exit_code == 0
    _refused(published / "synthetic.parquet", private, public, "cannot be checked")


def test_a_run_from_in_memory_data_is_checked_by_its_record_keys(tmp_path, monkeypatch):
    use_fake_backends(monkeypatch)
    monkeypatch.setattr(runner, "_make_embedder", lambda spec: HashEmbedderForTests())
    frame = pd.read_csv(write_private(tmp_path / "p.csv", n=12))
    out = tmp_path / "run"
    wasp_vllm.generate(frame, out=out, plms=["a"], task="drugs", n=12, rounds=2, q=2, s=2)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["config"]["private"] == "<in-memory>"
    frame.iloc[:3].to_csv(tmp_path / "exported.csv", index=False)  # the notebook's data, saved later
    _refused(out / "synthetic.parquet", tmp_path / "p.csv", tmp_path / "exported.csv", "shares records")
    (out / "private" / "record_keys.json").unlink()
    _refused(out / "synthetic.parquet", tmp_path / "p.csv", tmp_path / "exported.csv", "cannot be checked")


def test_a_private_file_passed_alongside_is_compared_record_by_record(tmp_path, run_on_a_file):
    private, synthetic = run_on_a_file
    copy = shutil.copyfile(private, tmp_path / "copy.csv")
    refused = _evaluate(synthetic, private, "--reference", str(copy), "--reference-public", "--private",
                        str(private))  # fmt: skip
    assert refused.exit_code == 2 and "shares records with the private set" in refused.output


def _built_in_run(tmp_path: Path, source: str) -> Path:
    """A run folder whose manifest names a built-in private set (only the manifest is read)."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "manifest.json").write_text(json.dumps({"config": {"private": published_source(source)}}))
    return run / "synthetic.parquet"


@pytest.mark.parametrize("reference", ["drugs", "drugs:fit", "drugs:train"])
def test_a_built_in_private_set_cannot_be_declared_public(tmp_path, reference):
    synthetic = _built_in_run(tmp_path, "drugs")
    scored = EvalSettings(test="drugs", task="drugs", reference=reference, reference_public=True)
    with pytest.raises(ValueError, match="overlaps the private data of the run"):
        evaluate_synthetic(synthetic, scored)


def test_another_split_passes_the_check_and_an_unknown_run_is_refused(tmp_path):
    from wasp_vllm.evaluation.reference import check_declared_public
    from wasp_vllm.tasks import get_task

    synthetic = _built_in_run(tmp_path, "drugs")
    scored = EvalSettings(test="drugs", task="drugs", reference="drugs:test", reference_public=True)
    check_declared_public(scored, get_task("drugs"), synthetic)  # the test split holds no fit record
    os.remove(synthetic.parent / "manifest.json")
    with pytest.raises(ValueError, match="cannot be checked"):
        evaluate_synthetic(synthetic, scored)
