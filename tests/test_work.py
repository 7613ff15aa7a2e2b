"""Where the work went: samples and tokens generated against kept, per PLM and round, in the manifest,
the end-of-run summary and the report (issue 22, item 5; issue 25, item 6).  The accounting closes
(generated = kept + rejects) and a run still writes exactly N rows."""

from __future__ import annotations

import json

from typer.testing import CliRunner

import wasp_vllm
from tests.fakes import RewritingFakeEngineForUnitTests, use_fake_backends
from wasp_vllm.cli import app
from wasp_vllm.engines.base import Completion
from wasp_vllm.report.page import WORK_PNG, render_report

SMALL = dict(plms=["a", "b"], n=36, rounds=3, q=2, s=2)


class JunkEveryKth(RewritingFakeEngineForUnitTests):
    """A PLM whose every k-th sample is whitespace (the quality gate rejects it as empty); with
    ``mostly=True`` every sample but the k-th."""

    def __init__(self, name: str, k: int, mostly: bool = False) -> None:
        super().__init__(name)
        self.k, self.mostly = k, mostly

    def rewrite(self, completion, params):
        junk = (self.count % self.k == 0) != self.mostly
        return Completion("  ", 3) if junk else completion


def test_generated_against_kept_per_plm_and_round(tmp_path, monkeypatch):
    use_fake_backends(monkeypatch, {"a": JunkEveryKth("a", 3)})
    result = wasp_vllm.generate(**SMALL, out=tmp_path / "run")
    manifest = result.manifest.to_json()  # as published
    assert manifest["output"]["rows"] == 36  # rejects were regenerated: still exactly N rows
    for record in manifest["rounds"]:
        for plm in ("a", "b"):
            rejects = sum(record["rejects"].get(plm, {}).values())
            assert record["generated"][plm] == record["kept"][plm] + rejects, (record["round"], plm)
            assert record["tokens"][plm] >= record["kept_tokens"][plm] > 0
    work = manifest["work"]
    assert work["a"]["generated"] > work["a"]["kept"] and 0.6 < work["a"]["kept_share"] < 0.8
    assert work["b"]["kept_share"] == 1.0 and work["b"]["tokens"] == work["b"]["kept_tokens"]
    assert sum(w["kept"] for w in work.values()) == 36
    assert work["a"]["tokens"] - work["a"]["kept_tokens"] == 3 * (work["a"]["generated"] - work["a"]["kept"])


class SameTextsAcrossPLMs(RewritingFakeEngineForUnitTests):
    """Every PLM writes "sample 1", "sample 2", ... (named after the label asked): unique within a
    PLM, the same across PLMs, so the round drops the copies and asks for more."""

    def rewrite(self, completion, params):
        phrase = completion.text.split('"')[0].split()[-2:]
        return Completion(f"sample number {self.count} reads {' '.join(phrase)}", 7)


def test_copies_across_plms_are_counted_as_rejects(tmp_path, monkeypatch):
    use_fake_backends(monkeypatch, {"a": SameTextsAcrossPLMs("a"), "b": SameTextsAcrossPLMs("b")})
    manifest = wasp_vllm.generate(**SMALL, out=tmp_path / "run").manifest.to_json()
    assert manifest["output"]["rows"] == 36
    rejects = [r["rejects"].get(p, {}) for r in manifest["rounds"] for p in "ab"]
    assert sum(r.get("duplicate_across_plms", 0) for r in rejects) > 0
    for record in manifest["rounds"]:
        for plm in ("a", "b"):
            assert record["generated"][plm] == record["kept"][plm] + sum(record["rejects"][plm].values())


def test_the_summary_shows_it_and_warns_when_most_is_thrown_away(tmp_path, monkeypatch):
    use_fake_backends(monkeypatch, {"a": JunkEveryKth("a", 3, mostly=True), "b": JunkEveryKth("b", 2)})
    monkeypatch.chdir(tmp_path)
    argv = ["generate", "--plms", "a,b", "--n", "36", "--rounds", "3", "--q", "2", "--s", "2",
            "--engine-arg", "max_attempts=12", "--out", "out"]  # fmt: skip
    result = CliRunner().invoke(app, argv, env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    first = manifest["rounds"][0]
    assert f"{first['kept']['a']} of {first['generated']['a']} (w=" in result.output  # the table's cells
    text = " ".join(result.output.split())
    work = manifest["work"]["a"]
    assert f"a kept {work['kept']} of {work['generated']} samples" in text
    assert f"{work['kept_tokens']:,} of {work['tokens']:,} tokens" in text
    assert "most of the generation was thrown away" in text  # a third and a half kept: below the line
    assert manifest["output"]["rows"] == 36


def test_the_report_draws_it(tmp_path, monkeypatch):
    use_fake_backends(monkeypatch, {"a": JunkEveryKth("a", 3)})
    run = wasp_vllm.generate(**SMALL, out=tmp_path / "run").out
    page = render_report(run)
    html = page.read_text()
    assert (page.parent / WORK_PNG).stat().st_size > 1000
    assert 'id="work"' in html and f'src="{WORK_PNG}"' in html and "samples generated" in html
