"""``generate --dry-run`` and ``wasp_vllm.plan``: the plan of a run from settings and public facts.

It must never read the private data (a missing file still gives a plan, with a warning; an
in-memory set is never touched), load a model or write anything; it says where its throughput
comes from (the last run here, else a built-in table); and a real run records the estimate beside
what happened."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

import wasp_vllm
from tests.fakes import use_fake_backends
from tests.test_reliability import write_private
from wasp_vllm.cli import app
from wasp_vllm.config import RunConfig
from wasp_vllm.pipeline import privacy_plan, throughput
from wasp_vllm.pipeline.estimate import plan_run
from wasp_vllm.pipeline.store import write_json

DEMO = ["--plms", "smollm2,gemma3", "--task", "drugs", "--n", "300", "--rounds", "5", "--epsilon", "4",
        "--q", "8", "--s", "8", "--max-new-tokens", "64"]  # fmt: skip


@pytest.fixture(autouse=True)
def scratch_cache(tmp_path, monkeypatch):
    """An empty cache of measurements, and a CPU-only machine (nvidia-smi finds nothing)."""
    monkeypatch.setenv("WASP_VLLM_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr("wasp_vllm.pipeline.estimate.nvidia_gpus", lambda: [])


class Untouchable:
    """Private data that fails the moment anything looks at it (its length, rows, columns)."""

    def __getattr__(self, name):
        raise AssertionError(f"the dry run looked at the private data ({name})")

    def __len__(self):
        raise AssertionError("the dry run took the private data's size")

    def __iter__(self):
        raise AssertionError("the dry run read the private data")


READERS = (
    "wasp_vllm.data.records.load_private",
    "wasp_vllm.pipeline.context.load_private",
    "wasp_vllm.pipeline.context.table_to_set",
    "wasp_vllm.api.as_table",
    "wasp_vllm.engines.make_engine",
    "wasp_vllm.engines.registry.packaged_model_dir",
)


def never(*_a, **_k):
    raise AssertionError("the dry run called a reader of private data or a model loader")


@pytest.fixture
def no_readers(monkeypatch):
    """Every reader of private data, and the engines, fail if called."""
    for target in READERS:
        monkeypatch.setattr(target, never)


def test_the_dry_run_plans_without_the_private_file(tmp_path, monkeypatch, no_readers):
    monkeypatch.chdir(tmp_path)
    prior = ["--label-prior", "private"]  # so the plan shows a second release
    argv = ["generate", *DEMO, *prior, "--private", "nowhere/private.csv", "--out", "out", "--dry-run"]
    result = CliRunner().invoke(app, argv, env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    cfg = RunConfig(
        plms=["smollm2", "gemma3"], private="nowhere/private.csv", max_new_tokens=64, label_prior="private"
    )
    plan = privacy_plan(cfg)
    assert f"{plan.sigma:.3f}" in text and f"{plan.prior_sigma:.3f}" in text  # every release's sigma
    assert "epsilon 4.000 by the exact accountant" in text
    rows = [[c.strip() for c in line.split("│")[1:-1]] for line in result.output.splitlines()]
    assert [r for r in rows if r[:1] in (["0"], ["4"])] == [["0", "30", "30", "60"], ["4", "30", "30", "60"]]
    assert "built-in table" in text and "estimated wall time" in text and "tok/s" in text
    # the plan says what the run will miss here (the file system's word: the file is not opened)
    assert "--private nowhere/private.csv: file not found: the run itself needs it" in text
    assert not (tmp_path / "out").exists()  # nothing written


def test_the_python_api_plans_without_touching_in_memory_data(no_readers):
    plan = wasp_vllm.plan(Untouchable(), plms=["smollm2", "gemma3"], n=300, max_new_tokens=64)
    assert [sum(q.values()) for q in plan.quotas] == [60] * 5
    smollm2 = plan.engines[0]
    assert smollm2.samples == 150 and smollm2.tokens == smollm2.generated * 64  # the cap: the worst case
    assert smollm2.wall_s == pytest.approx(smollm2.startup_s + smollm2.tokens / smollm2.tokens_per_s)
    assert plan.total_s > max(e.wall_s for e in plan.engines)
    assert json.dumps(plan.to_dict())  # public and serialisable


def test_the_plan_uses_the_last_run_here_and_says_so():
    cfg = RunConfig(plms=["smollm2", "gemma3"], max_new_tokens=64)
    before = plan_run(cfg).engines[0]
    assert before.source.startswith(throughput.BUILT_IN) and before.tokens_per_s == 160.0
    stored = {"tokens_per_s": 300.0, "startup_s": 20.0, "when": "2026-01-01"}
    write_json(throughput.records_path(), {throughput.key("smollm2", before.engine, "cpu"): stored})
    after = plan_run(cfg).engines[0]
    assert after.source.startswith(throughput.LAST_RUN) and after.tokens_per_s == 300.0
    assert after.startup_s == 20.0
    # per-sample facts stay public figures: the token cap and the built-in reject rate
    assert after.generated == before.generated and after.tokens == after.generated * 64
    assert plan_run(cfg).engines[1].source.startswith(throughput.BUILT_IN)  # gemma3 not measured yet


def test_a_gpu_box_plans_for_the_gpu_and_a_missing_model_says_how_to_get_it(monkeypatch):
    monkeypatch.setattr("wasp_vllm.pipeline.estimate.nvidia_gpus", lambda: ["NVIDIA H100 80GB HBM3"])
    plan = plan_run(RunConfig(plms=["llama3", "qwen"], n=6000, task="drugs"))
    assert plan.summary["device"] == "gpu" and plan.concurrent
    assert all("gpu" in e.source for e in plan.engines if e.engine != "hf")
    assert plan.engines[0].resolves.startswith("no") and "hf download meta-llama" in plan.engines[0].resolves
    result = CliRunner().invoke(
        app, ["generate", "--plms", "llama3,qwen", "--dry-run"], env={"COLUMNS": "200"}
    )
    # A plan that prints is a run that starts: both missing PLMs named on one error line, exit 2.
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "2 PLMs cannot be used here" in lines[0], result.output
    assert "hf download meta-llama/Llama-3.1-8B-Instruct" in lines[0] and "'qwen'" in lines[0]


def test_bad_settings_are_still_one_clear_error():
    result = CliRunner().invoke(app, ["generate", "--epsilon", "-1", "--dry-run"])
    assert result.exit_code == 2 and "epsilon" in result.output and "Traceback" not in result.output


def test_a_run_records_the_estimate_beside_what_happened(tmp_path, monkeypatch):
    use_fake_backends(monkeypatch)
    result = wasp_vllm.generate(plms=["a", "b"], n=36, rounds=3, q=2, s=2, out=tmp_path / "run")
    estimate = result.manifest.estimate
    assert estimate is not None
    assert estimate["plan"]["summary"]["n"] == 36 and estimate["plan"]["total_s"] > 0
    measured = estimate["measured"]["plms"]
    assert set(measured) == {"a", "b"} and measured["a"]["engine"] == "FakeEngineForUnitTests"
    assert sum(m["kept"] for m in measured.values()) == 36
    assert measured["a"]["tokens"] == result.manifest.tokens["a"]
    assert "public_work_s" in estimate["measured"]
    assert not throughput.records_path().exists()  # a test double's speed is never kept as a measurement


def test_the_dry_run_on_a_real_private_file_does_not_depend_on_its_size(tmp_path, monkeypatch):
    """The same path holding 12 records, then 300: the plan printed and returned is the same."""
    monkeypatch.chdir(tmp_path)
    outputs, plans = [], []
    for n in (12, 300):
        write_private(tmp_path / "private.csv", n=n)
        argv = ["generate", *DEMO, "--private", "private.csv", "--m", "50", "--out", "out", "--dry-run"]
        result = CliRunner().invoke(app, argv, env={"COLUMNS": "200"})
        assert result.exit_code == 0, result.output
        outputs.append(result.output)
        plans.append(json.dumps(wasp_vllm.plan("private.csv", plms=["smollm2", "gemma3"], n=300).to_dict()))
    assert outputs[0] == outputs[1] and plans[0] == plans[1]


def test_the_dry_run_warns_where_the_run_would_refuse_its_out_folder(tmp_path, monkeypatch, no_readers):
    """The run's own check of --out, as a warning (a plan may be made on another machine); the
    folder is left as it was."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "done").mkdir()
    (tmp_path / "done" / "manifest.json").write_text("{}")
    (tmp_path / "a-file").write_text("x")
    base = ["generate", *DEMO, "--private", "drugs", "--dry-run"]

    def dry(*extra: str) -> str:
        result = CliRunner().invoke(app, [*base, *extra], env={"COLUMNS": "200"})
        assert result.exit_code == 0, result.output
        return " ".join(result.output.split())

    assert "done already holds a run; pass --resume to continue it" in dry("--out", "done")
    assert "already holds a run" not in dry("--out", "done", "--resume")
    assert "--out a-file exists and is not a directory: the run would stop there" in dry("--out", "a-file")
    assert "the run would stop there" not in dry("--out", "new")
    assert sorted(p.name for p in (tmp_path / "done").iterdir()) == ["manifest.json"]
    assert not (tmp_path / "new").exists()
