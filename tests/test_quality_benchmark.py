"""`python -m benchmarks.quality.grid`, the quality benchmark, end to end on vLLM at CI size.

Slow: it loads both packaged PLMs and generates small runs.  It checks that the
benchmark produces its table, JSON and plots with a real score for every method, not what
the scores are (those are the benchmark's findings, committed under benchmarks/results/).
"""

from __future__ import annotations

import importlib
import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parent.parent
METHODS = ("only-private", "fusegen", "wasp")


def in_process(cmd: list[str]) -> None:
    """``python -m MODULE ARGS`` of a benchmark run that generates nothing (it reuses or scores
    finished runs), called in this process: CI time (each new interpreter imports torch, vLLM and
    the embedder again)."""
    module = importlib.import_module(cmd[cmd.index("-m") + 1])
    assert module.main(cmd[cmd.index("-m") + 2 :]) in (0, None)


def test_one_task_at_the_papers_sizes_scores_every_method(tmp_path):
    """One task (drugs, test split) at S = Q = 8, as the one-task script the grid absorbed ran it."""
    out, work = tmp_path / "results", tmp_path / "runs"
    # CI time: N=36 is the least at T=3 with S=8.  Aug-PE needs one PLM, so one engine starts; WASP
    # (both PLMs) and FuseGen run end to end in the grid's --quick test below, through the same
    # harness (this test took 241 s with WASP, 2026-12-05).
    cmd = [sys.executable, "-m", "benchmarks.quality.grid", "--tasks", "drugs", "--split", "test"]
    cmd += ["--seeds", "1", "--n", "36", "--rounds", "3", "--max-new-tokens", "32"]
    cmd += ["--methods", "only-private,aug-pe:smollm2"]
    cmd += ["--out", str(out), "--work", str(work), "--name", "q"]
    env = os.environ | {"HF_HUB_OFFLINE": "1", "VLLM_LOGGING_LEVEL": "WARNING"}
    done = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, done.stderr[-3000:]
    payload = json.loads((out / "q.json").read_text())
    assert payload["finished"] and not payload["skipped"]
    runs = {r["method"]: r for r in payload["runs"]}
    assert set(runs) == {"only-private", "aug-pe:smollm2"}
    assert all("error" not in r for r in runs.values()), [r.get("error") for r in runs.values()]
    for key, run in runs.items():
        assert 0.0 <= run["accuracy"] <= 1.0 and 0.0 <= run["macro_f1"] <= 1.0, key
    augpe = runs["aug-pe:smollm2"]
    assert 0 < augpe["n_synthetic"] <= 36 and math.isfinite(augpe["fid"])
    assert len(augpe["fid_per_round"]) == 3  # T=3: one FID per cumulative round
    assert augpe["privacy_plan"]["sigma"] > 0
    table = (out / "q.md").read_text()
    assert "| OnlyPrivate (no DP) |" in table and "| Aug-PE (smollm2) |" in table
    assert (out / "q.png").stat().st_size > 1000  # macro-F1 per method
    assert (out / "q_junk.png").stat().st_size > 1000


def test_quick_tasks_benchmark_scores_every_task_and_resumes(tmp_path):
    """`python -m benchmarks.quality.grid --quick` on trec alone, N=24, T=2, one seed, without Aug-PE (CI
    time: the quality benchmark's test runs Aug-PE, and the averaging over tasks has a fast test in
    test_benchmarks.py); a second invocation reuses every finished run and runs nothing, and so does
    a third with the run folders gone (a fresh clone resumes from the results JSON alone); before
    that, the test split's grid scores the validation grid's generations instead of running them."""
    out, work = tmp_path / "results", tmp_path / "runs"
    cmd = [
        sys.executable,
        "-m",
        "benchmarks.quality.grid",
        "--quick",
        "--tasks",
        "trec",
    ]
    cmd += ["--max-new-tokens", "24"]  # trec's questions are short; its own cap is 40 (CI time)
    cmd += ["--methods", ",".join(METHODS)]
    cmd += ["--out", str(out), "--work", str(work), "--name", "t"]
    env = os.environ | {"HF_HUB_OFFLINE": "1", "VLLM_LOGGING_LEVEL": "WARNING"}
    done = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, done.stderr[-3000:]
    payload = json.loads((out / "t.json").read_text())
    assert payload["finished"] and not payload["skipped"] and not payload["reused"]
    methods = set(METHODS)
    assert set(payload["tasks"]) == {"trec"}
    for task, entry in payload["tasks"].items():
        per = {k: v for k, v in entry.items() if k != "group"}
        assert entry["group"] == "choosing" and set(per) == methods, task
        for key, scores in per.items():
            assert scores["seeds"] == [0] and 0.0 <= scores["macro_f1"][0] <= 1.0, (task, key)
            assert 0.0 <= scores["accuracy"][0] <= 1.0
        assert 0.0 <= per["wasp"]["label_agreement"][0] <= 1.0 and math.isfinite(per["wasp"]["fid"][0])
        rounds = payload["rounds"][task]["wasp"]
        assert {(e["round"], e["plm"]) for e in rounds} == {
            (t, p) for t in (0, 1) for p in ("smollm2", "gemma3")
        }
        assert all(0.0 <= e["junk_share"] <= 1.0 for e in rounds if e["n"])
        measured = [e["similarity"] for e in rounds if e["similarity"] is not None]
        assert measured and all(-1.0 <= x <= 1.0 for x in measured)
        (wasp,) = [r for r in payload["runs"] if r["method"] == "wasp"]
        assert [e["round"] for e in wasp["diversity"]] == [0, 1]  # issue 59: per round, all PLMs
        assert 0.0 <= wasp["diversity"][0]["signal_share"] <= 1.0  # round 0's votes were released
        assert all(0.0 < e["distinct_2"] <= 1.0 and e["fid_validation"] > 0 for e in wasp["diversity"])
    assert set(payload["average"]) == methods
    assert len(payload["paired"]["average"]["wasp − fusegen"]["macro_f1"]["diffs"]) == 1
    assert "| WASP |" in (out / "t.md").read_text()
    assert (out / "t.png").stat().st_size > 1000 and (out / "t_junk.png").stat().st_size > 1000

    in_process(cmd)
    second = json.loads((out / "t.json").read_text())
    assert second["ran"] == [] and len(second["reused"]) == len(METHODS)  # one task
    assert second["tasks"] == payload["tasks"]

    # The test split's grid scores the generations the validation grid made: no run goes again.
    test_cmd = [*cmd, "--work", str(tmp_path / "runs-test"), "--name", "t_test", "--split", "test"]
    test_cmd += ["--score-from", str(work), "--max-minutes", "0"]  # the last --work and --name win
    scored = subprocess.run(test_cmd, env=env, cwd=REPO, capture_output=True, text=True, timeout=900)
    assert scored.returncode == 0, scored.stderr[-3000:]
    on_test = json.loads((out / "t_test.json").read_text())
    assert on_test["skipped"] == [["trec", "only-private", 0]]  # no generation to score: not run at 0 min
    assert sorted(key for _, key, _ in on_test["ran"]) == ["fusegen", "wasp"]
    val_runs = {r["method"]: r for r in payload["runs"]}
    for run in on_test["runs"]:
        made = val_runs[run["method"]]
        assert run["scored_from"] == made["cache_key"] and run["cache_key"] != made["cache_key"]
        assert run["gen_s"] == made["gen_s"]  # the validation grid's generation, not a new one
        # Scored again in another process: the embedder batches the reference's texts otherwise
        # (floats at 1e-6), which can move one of the 24 samples' agreement (seen: 0.625, 0.667).
        assert run["label_agreement"] == pytest.approx(made["label_agreement"], abs=1 / 24 + 1e-9)
        # FID is computed again from the same texts: on 2 AVX2 cores an embedding batched otherwise
        # moved it by 7.5e-9 (relative); another generation would move it by far more than 1e-6.
        assert run["fid"] == pytest.approx(made["fid"], rel=1e-6)
        assert 0.0 <= run["macro_f1"] <= 1.0

    # The same runs scored again, on the split's own label mix and on an even one.
    even_cmd = [
        sys.executable,
        "-m",
        "benchmarks.quality.even_mix",
        "--results",
        str(out / "t.json"),
    ]
    even_cmd += ["--out", str(out), "--name", "t_even"]
    in_process(even_cmd)
    mixes = json.loads((out / "t_even.json").read_text())
    assert mixes["largest_rescoring_change"] < 1e-9  # the grid's own scoring, repeated
    assert mixes["reused"] == 0  # the first scoring had nothing to keep
    assert {r["method"] for r in mixes["runs"]} == methods
    assert all(0.0 <= r["even_mix_macro_f1"] <= 1.0 for r in mixes["runs"])
    pair = mixes["paired"]["trec"]["wasp − fusegen"]
    assert set(pair) == {"macro_f1", "even_mix_macro_f1"} and (out / "t_even.png").stat().st_size > 1000

    shutil.rmtree(work)  # a fresh clone: only the results JSON is left, and it is enough
    in_process(even_cmd)  # every run was scored before: kept, not scored again
    kept = json.loads((out / "t_even.json").read_text())
    assert kept["reused"] == len(kept["runs"]) and kept["runs"] == mixes["runs"]
    afresh = [*even_cmd[:-1], "t_even_afresh"]  # no earlier scores to keep, and no run folders
    gone = subprocess.run(afresh, env=env, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert gone.returncode == 2 and "are not here" in gone.stderr  # nothing to score again
    in_process(cmd)
    resumed = json.loads((out / "t.json").read_text())
    assert resumed["ran"] == [] and len(resumed["reused"]) == len(METHODS)
    assert resumed["tasks"] == payload["tasks"]

    # A lever at today's default is the same run as WASP: its row reuses WASP's record, runs nothing.
    lever = "wasp-uniform-prior"  # the even label split, the default since 2026-11-29
    twin = [*cmd, "--methods", ",".join([*METHODS, lever]), "--max-minutes", "0"]  # the last wins
    in_process(twin)
    same = json.loads((out / "t.json").read_text())
    assert same["ran"] == [] and same["skipped"] == [] and ["trec", lever, 0] in same["reused"]
    assert same["tasks"]["trec"][lever]["macro_f1"] == payload["tasks"]["trec"]["wasp"]["macro_f1"]

    # Other settings are other runs: out of time, this grid finds none of them, and the results it
    # would drop stay where they are (its own tables go beside them, and it fails).
    other = subprocess.run([*cmd, "--n", "30", "--max-minutes", "0"], env=env, cwd=REPO, capture_output=True,
                           text=True, timeout=600)  # fmt: skip
    assert other.returncode == 1 and "did not reproduce" in other.stderr, other.stderr[-3000:]
    assert json.loads((out / "t.json").read_text()) == same
    partial = json.loads((out / "t-partial.json").read_text())
    assert [r["method"] for r in partial["runs"]] == ["only-private"]  # the 100 records: no N to change
