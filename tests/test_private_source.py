"""How a published run names its private data (issue 57, item 5): a built-in set by its public
name, a file by the owner's keyed fingerprint, never by its path (a path names people and places).
"""

from __future__ import annotations

import json

from typer.testing import CliRunner

from tests.fakes import use_fake_backends
from tests.privacy_checks import file_text
from tests.test_reliability import write_private
from wasp_vllm.cli import app
from wasp_vllm.pipeline.manifest import published_source
from wasp_vllm.pipeline.store import PUBLISHED
from wasp_vllm.privacy.secrets import keyed_name

FOLDER, FILE = "clinic-lutrisofa", "patients-zorblax.csv"  # names found nowhere else


def test_no_path_of_the_private_file_is_published(tmp_path, monkeypatch):
    use_fake_backends(monkeypatch)
    (tmp_path / FOLDER).mkdir()
    private = write_private(tmp_path / FOLDER / FILE, n=12)
    out = tmp_path / "run"
    argv = ["generate", "--plms", "a", "--private", str(private), "--n", "12", "--rounds", "2", "--q", "2",
            "--s", "2", "--out", str(out)]  # fmt: skip
    result = CliRunner().invoke(app, argv)
    assert result.exit_code == 0, result.output
    published = {name: file_text(out / name) for name in PUBLISHED}
    published["the default-level output"] = result.output
    for name, text in published.items():
        for part in (str(private), FOLDER, FILE, "patients-zorblax"):
            assert part not in text, f"{name} holds the private file's path ({part})"
    manifest = json.loads((out / "manifest.json").read_text())
    named = manifest["private_data"]["source"]
    assert named.startswith("hmac-sha256:") and manifest["config"]["private"] == named
    assert named == published_source(str(private))  # the owner recognises the file; others cannot


def test_built_in_sets_keep_their_public_names_and_files_are_keyed(tmp_path):
    assert published_source("drugs") == "drugs" and published_source("drugs:fit") == "drugs:fit"
    assert published_source(None) is None and published_source("<in-memory>") == "<in-memory>"
    named = published_source(str(tmp_path / "x.csv"))
    assert named is not None and named != published_source(str(tmp_path / "y.csv"))
    assert keyed_name("x.csv", b"k" * 32) != keyed_name("x.csv", b"j" * 32)  # keyed: no guess can be tested


def test_a_relative_path_or_one_that_starts_with_an_angle_bracket_is_keyed_too(tmp_path, monkeypatch):
    """Only the exact in-memory marker is published as it is: ``<clinic-x>/patients.csv`` and a
    relative ``patients.csv`` name a file, which the manifest names by its keyed fingerprint."""
    use_fake_backends(monkeypatch)
    monkeypatch.chdir(tmp_path)
    (tmp_path / f"<{FOLDER}>").mkdir()
    for given in (f"<{FOLDER}>/{FILE}", FILE):
        write_private(tmp_path / given, n=12)
        out = tmp_path / f"run-{len(given)}"
        argv = ["generate", "--plms", "a", "--private", given, "--n", "12", "--rounds", "2", "--q", "2",
                "--s", "2", "--out", str(out)]  # fmt: skip
        result = CliRunner().invoke(app, argv)
        assert result.exit_code == 0, result.output
        text = (out / "manifest.json").read_text()
        assert given not in text and FOLDER not in text and "patients-zorblax" not in text
        named = json.loads(text)["config"]["private"]
        assert named == published_source(str(tmp_path / given)) and named.startswith("hmac-sha256:")
    assert published_source(f"<{FOLDER}>/{FILE}") != f"<{FOLDER}>/{FILE}"
