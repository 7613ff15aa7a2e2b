"""Golden outputs of every strategy: a redesign of the round loop must not change a byte of them.

Each case runs the real round loop (quotas, prompts, cleaning, voting, noise, selection, weights,
checkpoints, manifest) with ``FakeEngineForUnitTests`` and ``HashEmbedderForTests`` (named as
such: the subject is the loop, not an LLM) and fixed seeds, and compares ``synthetic.parquet``
and ``manifest.json`` with the files stored in ``tests/golden/``.  Left out of the comparison:
wall-clock timings (``timings_s``, ``tokens_per_s``, each round's ``seconds``), package
versions and the FAISS build (``search``).  Recorded again deliberately for issue 25: the manifest
gained ``work`` and ``sampling``, each round ``generated`` and ``kept_tokens``, the settings
``license``; nothing else changed (checked before recording).  Recorded again for issue 22: the
settings gained ``later_prompt`` (one line per manifest; nothing else changed), and ``dtype``
(the PLMs' number type, 'auto'; one line per manifest, nothing else changed).  Parquet files
are compared byte for byte when written by the pyarrow version that wrote the golden files (its
version is in the file), else as tables with their metadata.  Issue 73 added the task itself
(``task_spec``) and the samples cut at the token cap (``capped``, per round and in ``work``):
checked, then left out of the comparison.

Regenerate (only when a change of output is intended, and say so in the commit):
``WASP_UPDATE_GOLDEN=1 python -m pytest tests/test_golden.py``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.fakes import FakeEngineForUnitTests, HashEmbedderForTests
from tests.privacy_checks import private_texts
from wasp_vllm.config import RunConfig
from wasp_vllm.config.run import MOVED_TO_ENGINE_ARGS, REMOVED
from wasp_vllm.pipeline import Run, prepare
from wasp_vllm.pipeline.manifest import Manifest, published_source
from wasp_vllm.tasks import get_task

GOLDEN = Path(__file__).parent / "golden"
LABELS = ["positive", "neutral", "negative"]
UPDATE = os.environ.get("WASP_UPDATE_GOLDEN") == "1"

BASE = dict(plms=["a", "b"], task="drugs", private="private.csv", private_limit=None, n=36, rounds=3, q=2,
            s=2, noise_seed=11, engine_args={"concurrent": False}, seed=3,
            label_prior="uniform", far_votes="on")  # fmt: skip
CASES: dict[str, dict] = {
    "wasp": {},
    "wasp-m": {"private_limit": 20},
    "wasp-no-contrast": {"strategy": "wasp-no-contrast"},
    "wasp-no-weighting": {"strategy": "wasp-no-weighting"},
    "wasp-paper-accountant": {"accountant": "paper"},
    "aug-pe": {"strategy": "aug-pe", "plms": ["a"]},
    "fusegen": {"strategy": "fusegen"},
    "pre-text": {"strategy": "pre-text", "parties": 3},
    "federated": {"parties": 3, "tolerance": 1},
    "user-level": {"user_col": "user", "privacy_unit": "user", "max_records_per_user": 2},
}


def _write_private(folder: Path) -> None:
    texts = private_texts(40, seed=21, words=7)
    rows = [f"{t},{LABELS[i % 3]},u{i % 9}" for i, t in enumerate(texts)]
    (folder / "private.csv").write_text("text,label,user\n" + "\n".join(rows) + "\n")


def _renamed(golden: dict) -> dict:
    """Fields deliberately renamed since the golden files were recorded (issue 13): the ablations
    were the settings ``contrastive`` / ``weighting`` and are now strategies of their own."""
    config = golden["config"]
    for name in REMOVED:  # rejected levers left the settings (2026-12), recorded at their off value
        config.pop(name, None)
    if not config.pop("contrastive", True):
        config["strategy"] += "-no-contrast"
    if not config.pop("weighting", True):
        config["strategy"] += "-no-weighting"
    # Issue 74: the engine settings became one table of engine arguments (2026-12).
    config["engine_args"] = {name: config.pop(name) for name in MOVED_TO_ENGINE_ARGS if name in config}
    if "max_attempts" not in config["engine_args"]:  # recorded before it moved from sampling
        config["engine_args"]["max_attempts"] = config.pop("max_attempts")
    return golden


#: Fields added to a round's record since the golden files were recorded (issues 14, 15, 73).
ADDED_ROUND_FIELDS = ("missing", "rejects", "capped")
#: Settings added since: the golden runs have them at the value here, which behaves as before they existed.
ADDED_SETTINGS = {
    "label_prior": "uniform",
    "label_prior_share": 0.1,
    "far_votes": "on",
    "utility_check_share": 0.0,
    "publish_better": False,
}
#: Fields added to the privacy plan since: both histograms released, as before the field existed.
ADDED_PLAN_FIELDS = {"histograms": 2}


def _comparable_manifest(manifest: dict) -> dict:
    machine = ("timings_s", "tokens_per_s", "versions", "search")  # "search": which FAISS build is here
    manifest = {k: v for k, v in manifest.items() if k not in machine}
    # Issue 73: the manifest records the task itself, here the built-in one the run names, and the
    # samples cut at the token cap (none: the fake engine writes 12 tokens, far below the cap).
    assert manifest.pop("task_spec") == get_task(str(BASE["task"])).model_dump(mode="json")
    assert all(w.pop("capped") == 0 for w in manifest["work"].values())
    assert all(sum(r["capped"].values()) == 0 for r in manifest["rounds"])
    drop = ("seconds", *ADDED_ROUND_FIELDS)
    manifest["rounds"] = [{k: v for k, v in r.items() if k not in drop} for r in manifest["rounds"]]
    for name, off in ADDED_SETTINGS.items():
        assert manifest["config"].pop(name) == off, name
    for name, before in ADDED_PLAN_FIELDS.items():
        assert manifest["privacy"]["plan"].pop(name) == before, name
    # Issue 74: the plan owns the vote schedule (the paper's: after every round but the last).
    plan = manifest["privacy"]["plan"]
    assert plan.pop("vote_rounds") == list(range(plan["compositions"]))
    # Issue 57: the private file is named by the owner's keyed fingerprint (this session's key).
    named = published_source(str(BASE["private"]))
    assert manifest["config"]["private"] == manifest["private_data"]["source"] == named
    manifest["config"]["private"] = manifest["private_data"]["source"] = BASE["private"]
    return manifest


@pytest.mark.parametrize("case", list(CASES))
def test_strategy_output_is_unchanged(case, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _write_private(tmp_path)
    cfg = RunConfig(**(BASE | CASES[case]))

    def factory(name: str, _cfg: RunConfig) -> FakeEngineForUnitTests:
        return FakeEngineForUnitTests(name)

    manifest = (
        Run(prepare(cfg), "out", engine_factory=factory, embedder=HashEmbedderForTests()).execute().to_json()
    )
    produced = tmp_path / "out" / "synthetic.parquet"
    text = json.dumps(_comparable_manifest(manifest), indent=1, sort_keys=True) + "\n"
    golden_parquet, golden_manifest = GOLDEN / f"{case}.parquet", GOLDEN / f"{case}.manifest.json"
    if UPDATE:
        GOLDEN.mkdir(exist_ok=True)
        golden_parquet.write_bytes(produced.read_bytes())
        golden_manifest.write_text(text)  # (recorded before issue 13's renames: see _renamed)
    expected = json.dumps(_renamed(json.loads(golden_manifest.read_text())), indent=1, sort_keys=True) + "\n"
    assert text == expected, f"{case}: the manifest changed"
    writers = {pq.ParquetFile(p).metadata.created_by for p in (golden_parquet, produced)}
    if len(writers) == 1:
        assert produced.read_bytes() == golden_parquet.read_bytes(), f"{case}: synthetic.parquet changed"
    else:  # another pyarrow wrote it: the same table, schema and metadata
        a, b = pq.read_table(produced), pq.read_table(golden_parquet)
        assert a.equals(b) and a.schema.equals(b.schema, check_metadata=True), case
    assert isinstance(pq.read_table(produced), pa.Table)
    # the typed manifest reads the published file back to the same JSON
    published = json.loads((tmp_path / "out" / "manifest.json").read_text())
    again = Manifest.from_json(published).to_json()
    assert again == published
