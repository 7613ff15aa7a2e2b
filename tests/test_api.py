"""The Python API: data frames, records and datasets in, a RunResult out; the README example runs.

Generation comes from ``FakeEngineForUnitTests`` and embeddings from ``HashEmbedderForTests``
(named as such): the subject is the API's handling of inputs and outputs, not an LLM.
"""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd
import pytest

import wasp_vllm
from tests.fakes import FakeEngineForUnitTests, HashEmbedderForTests, use_fake_backends
from tests.privacy_checks import private_texts
from wasp_vllm.pipeline import Backends, Collaborators

ROOT = Path(__file__).resolve().parents[1]
LABELS = ["positive", "neutral", "negative"]
SMALL = dict(plms=["a", "b"], task="drugs", n=36, rounds=3, q=2, s=2, private_limit=None, noise_seed=3)


def frame(n: int = 30) -> pd.DataFrame:
    return pd.DataFrame({"review": private_texts(n, seed=8), "rating": [LABELS[i % 3] for i in range(n)]})


def fake() -> Collaborators:
    """The run's engines and embedder: FAKES for unit tests."""
    return Collaborators(
        backends=Backends(lambda name, cfg: FakeEngineForUnitTests(name), HashEmbedderForTests())
    )


def test_a_data_frame_in_a_data_frame_out(tmp_path):
    result = wasp_vllm.generate(
        frame(), text_col="review", label_col="rating", out=tmp_path / "run", collaborators=fake(), **SMALL
    )
    df = result.to_pandas()
    assert len(df) == 36 and set(df["label"]) == set(LABELS) and "embedding" not in df
    assert result.privacy.compositions == 2 and result.manifest.output.rows == 36  # 2 votes
    assert result.manifest.config["private"] == "<in-memory>"  # no path, no record of the data
    assert [p.name for p in result.shareable] == ["synthetic.parquet", "manifest.json", "README.md"]
    assert result.to_pandas(embeddings=True)["embedding"].map(len).eq(64).all()


def test_records_and_resume_with_the_same_data_only(tmp_path):
    records = frame().rename(columns={"review": "text", "rating": "label"}).to_dict("records")
    out = tmp_path / "run"
    first = wasp_vllm.generate(records, out=out, collaborators=fake(), **SMALL)
    again = wasp_vllm.generate(records, out=out, resume=True, collaborators=fake(), **SMALL)
    assert again.manifest.output.sha256 == first.manifest.output.sha256
    other = [dict(r, text=r["text"] + " changed") for r in records]
    with pytest.raises(ValueError, match="different private data"):
        wasp_vllm.generate(other, out=out, resume=True, collaborators=fake(), **SMALL)


def test_bad_inputs_are_clear_errors(tmp_path):
    with pytest.raises(ValueError, match="not supported"):
        wasp_vllm.generate(42, out=tmp_path / "a", collaborators=fake(), **SMALL)
    with pytest.raises(ValueError, match="no text column 'text'"):
        wasp_vllm.generate(frame(), out=tmp_path / "b", collaborators=fake(), **SMALL)
    with pytest.raises(ValueError, match="unknown setting 'epsilonn'"):
        wasp_vllm.generate(frame(), out=tmp_path / "c", collaborators=fake(), epsilonn=3, **SMALL)


def test_hugging_face_datasets_in_and_out(tmp_path):
    datasets = pytest.importorskip("datasets")
    ds = datasets.Dataset.from_pandas(frame().rename(columns={"review": "text", "rating": "label"}))
    result = wasp_vllm.generate(ds, out=tmp_path / "run", collaborators=fake(), **SMALL)
    loaded = datasets.load_dataset("parquet", data_files=str(result.synthetic_path), split="train")
    assert loaded.num_rows == 36 and {"text", "label", "plm", "round"} <= set(loaded.column_names)
    assert result.to_dataset().num_rows == 36


def test_the_readme_example_runs(tmp_path, monkeypatch):
    """The README's Python example, executed as written (with the test doubles as backends)."""
    readme = (ROOT / "README.md").read_text()
    code = re.search(r"```python\n(.*?)```", readme, flags=re.S).group(1)
    use_fake_backends(monkeypatch)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("wasp_vllm.evaluation.runner._make_embedder", lambda spec: HashEmbedderForTests())
    namespace: dict = {}
    exec(compile(code, "README.md", "exec"), namespace)  # noqa: S102 - the documented example itself
    assert len(namespace["synthetic"]) == namespace["result"].manifest.config["n"]
    assert 0.0 <= namespace["report"].macro_f1 <= 1.0


def test_the_privacy_report_reads_every_manifest_shape():
    """The typed account of what a run spent, from the golden manifests (votes only; a method that
    never votes) and from a ledger holding a label-prior release beside the votes."""
    import json
    from pathlib import Path

    from wasp_vllm.privacy.plan import BudgetShares, plan_privacy
    from wasp_vllm.privacy.report import LedgerReport, PrivacyReport

    golden = Path(__file__).parent / "golden"
    wasp = PrivacyReport.from_json(json.loads((golden / "wasp.manifest.json").read_text())["privacy"])
    assert wasp.compositions == len(wasp.sigmas) == 2 and wasp.sigma == wasp.sigmas[0] > 0
    assert wasp.epsilon_spent <= wasp.epsilon_budget == 4.0 and wasp.ledger.neighbours == ("add_remove",)
    assert wasp.plan.vote_rounds == (0, 1) and wasp.plan.sigma == wasp.sigma
    fusegen = PrivacyReport.from_json(json.loads((golden / "fusegen.manifest.json").read_text())["privacy"])
    assert fusegen.compositions == 0 and fusegen.sigma is None and fusegen.sensitivities == ()
    plan = plan_privacy(4.0, 1e-5, 3, 8, shares=BudgetShares(label_prior=0.2))
    ledger = plan.open_ledger()
    for release in plan.planned_releases():
        ledger.record(release)
    mixed = LedgerReport.of(ledger)
    assert mixed.sigma is None and mixed.sigmas == [plan.prior_sigma, plan.sigma, plan.sigma]
    assert mixed.sensitivities == tuple(sorted({plan.prior_sensitivity, plan.sensitivity}))
    assert mixed.epsilon_spent == pytest.approx(4.0)
