"""The benchmark scripts without models: the shared reporting helper, re-rendering every committed
result from its JSON (figures kept, reproduce command on top), the stage arithmetic of
``pipeline_stages`` and the brute-force searches ``topq_search`` measures against FAISS."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest

from benchmarks import engine_overhead, gen_workload, pipeline_stages, reference_loop, report, topq_search

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"

SCRIPTS = {m.NAME: m for m in (engine_overhead, pipeline_stages, reference_loop, topq_search)}


def test_table_and_header() -> None:
    t = report.Table("T", ["a", "b"], [["x", 1234.5], ["y", float("nan")], ["z", 0.012345]], ["a note"])
    assert t.markdown().splitlines() == ["## T", "", "| a | b |", "|---|---|", "| x | 1234 |", "| y | - |",
                                         "| z | 0.0123 |", "", "- a note"]  # fmt: skip
    payload = {"command": "python benchmarks/x.py --quick", "machine": report.machine(), "wall_s": 3.0}
    lines = report.header("Title", payload)
    assert lines[:3] == ["# Title", "", "Reproduce: `python benchmarks/x.py --quick`"]
    assert any(line.startswith("Machine: ") and "load average" in line for line in lines)
    assert report.median([3.0, 1.0, 2.0]) == 2.0 and report.ratio(1.0, 0.0) != report.ratio(1.0, 0.0)


def test_command_runs_the_script_as_a_module_of_the_repository() -> None:
    assert report.command(str(BENCH / "topq_search.py"), ["--quick", "--out", "a b"]) == (
        "python -m benchmarks.topq_search --quick --out 'a b'"
    )
    assert (
        report.command(str(BENCH / "quality" / "lever_rule.py"), [])
        == "python -m benchmarks.quality.lever_rule"
    )


def test_json_takes_numpy_values(tmp_path: Path) -> None:
    report.write_json(tmp_path / "x.json", {"a": np.float32(0.5), "b": np.arange(3), "c": np.int64(2)})
    assert json.loads((tmp_path / "x.json").read_text()) == {"a": 0.5, "b": [0, 1, 2], "c": 2}


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_committed_results_re_render(name: str, tmp_path: Path) -> None:
    saved = BENCH / "results" / f"{name}.json"
    assert SCRIPTS[name].main(["--from-json", str(saved), "--out", str(tmp_path)]) == 0
    md = (tmp_path / f"{name}.md").read_text()
    assert md.splitlines()[2] == f"Reproduce: `python -m benchmarks.{name} --quick`"
    assert "earlier combined throughput run" in md and f"![{name}]({name}.png)" in md
    assert (tmp_path / f"{name}.png").stat().st_size > 5000
    assert json.loads((tmp_path / f"{name}.json").read_text()) == json.loads(saved.read_text())
    assert md == (BENCH / "results" / f"{name}.md").read_text()  # the committed Markdown is this rendering


def test_committed_figures_are_the_earlier_measurements() -> None:
    md = {n: (BENCH / "results" / f"{n}.md").read_text() for n in SCRIPTS}
    assert (
        "| VLLMEngine.generate (wrapper) | 37.3 | 35.5 | 38.2 | 31.5 | 0.994 | 1.02 |"
        in md["engine_overhead"]
    )
    assert "| smollm2 | hf engine (HFEngine, batch 32) | 0.9 | 9.31 | 0.348 | 0.702 |" in md["reference_loop"]
    assert "| 1,000 | 100,000 | 5.71 | 0.915 | 0.631 | 0.16 | 0.11 |" in md["topq_search"]
    assert "| start-up: gemma3 | 47 | 18.5% | - |" in md["pipeline_stages"]


def stage_payload(concurrent: bool) -> dict:
    timings = {"startup:a": 10.0, "startup:b": 20.0, "generation:a": 30.0, "prompts:a": 1.0,
               "generation:b": 40.0, "prompts:b": 2.0, "embedding": 5.0, "io": 1.0,
               "private:embedding": 3.0, "private:voting": 2.0}  # fmt: skip
    gen_wall = 40.0 if concurrent else 70.0
    wall = 30.0 + gen_wall + 11.0 + 4.0  # start-ups, generation, the other stages, 4 s untimed
    return {
        "wall_s": wall,
        "timings_s": timings,
        "generation_wall_s": gen_wall,
        "tokens_per_s": {},
        "rows": 0,
    }


@pytest.mark.parametrize("concurrent", [False, True])
def test_stages_add_up_to_wall_time(concurrent: bool) -> None:
    b = stage_payload(concurrent)
    rows = pipeline_stages.stages(b)
    assert sum(sec for _, sec, _ in rows) == pytest.approx(b["wall_s"])
    untimed = [sec for label, sec, kind in rows if kind == "untimed"]
    assert untimed == [pytest.approx(4.0)]
    sh = pipeline_stages.shares(b)
    assert sh["non_generation"] == pytest.approx(1.0 + 2.0 + 5.0 + 1.0 + 3.0 + 2.0)
    assert sh["steady"] == pytest.approx(b["wall_s"] - 30.0)
    overlap = [sec for label, sec, _ in rows if "overlap" in label]
    assert overlap == ([pytest.approx(-30.0)] if concurrent else [])


def test_stage_table_renders(tmp_path: Path) -> None:
    settings = {"plms": ["a", "b"], "n": 60, "rounds": 3, "private": 100, "gpu": True}
    payload = {"command": "x", "machine": "test", "results": stage_payload(True), "settings": settings}
    report.write_all(tmp_path, "p", "P", payload, [pipeline_stages.table(payload)], pipeline_stages.plot)
    md = (tmp_path / "p.md").read_text()
    assert "| generation: a (engine + sample cleaning) | 29 |" in md and "overlap of concurrent PLMs" in md


def test_brute_forces_agree_with_the_exact_search() -> None:
    from wasp_vllm.privacy.search import topq_near_far

    rng = np.random.default_rng(1)
    p, s = rng.standard_normal((40, 16), dtype=np.float32), rng.standard_normal((300, 16), dtype=np.float32)
    pl, sl = rng.integers(0, 3, 40), rng.integers(0, 3, 300)
    sl[sl == 2] = 1  # label 2 has no synthetic rows: all -1
    near, far = topq_near_far(p, pl, s, sl, 8, use_gpu=False)
    for fn in (topq_search.numpy_topq, topq_search.torch_topq):
        got_near, got_far = fn(p, pl, s, sl, 8)
        np.testing.assert_array_equal(got_near, near)
        np.testing.assert_array_equal(got_far, far)


def test_interleave_rotates_the_order() -> None:
    calls: list[str] = []

    def variant(key: str) -> Callable[[], int]:
        def run() -> int:
            calls.append(key)
            return 10

        return run

    runs = gen_workload.interleave({k: variant(k) for k in "abc"}, reps=3, label="t", sync=False)
    assert calls == list("abcbcacab")
    assert {k: len(v) for k, v in runs.items()} == {"a": 3, "b": 3, "c": 3}
    assert all(r["tokens"] == 10 for v in runs.values() for r in v)
    ratios = gen_workload.paired_ratios({"x": [{"tps": 2.0}], "y": [{"tps": 4.0}]}, "x", "y", "tps")
    assert ratios == [0.5]


def test_the_tasks_benchmark_averages_each_seed_over_every_task_and_pairs_by_seed():
    """quality_tasks' arithmetic, on made-up scores (its slow test runs the real harness on one task)."""
    from benchmarks.quality import grid_report

    def run(task: str, method: str, seed: int, f1: float) -> dict:
        return {"task": task, "method": method, "seed": seed, "macro_f1": f1, "accuracy": f1,
                "label_agreement": None, "fid": 1.0, "gen_s": 1.0}  # fmt: skip

    scores = {("tweets", "wasp"): (0.5, 0.7), ("tweets", "fusegen"): (0.4, 0.4),
              ("trec", "wasp"): (0.3, 0.1), ("trec", "fusegen"): (0.2, 0.2)}  # fmt: skip
    runs = [run(t, m, seed, f1s[seed]) for (t, m), f1s in scores.items() for seed in (0, 1)]
    runs.append({**run("trec", "wasp", 2, 0.9), "error": "crashed"})  # a failed run is left out
    runs.append(run("tweets", "wasp", 2, 0.9))  # seed 2 only on one task: not averaged
    tasks = grid_report.per_task(runs)
    assert tasks["trec"]["wasp"]["seeds"] == [0, 1] and tasks["tweets"]["wasp"]["seeds"] == [0, 1, 2]
    average = grid_report.averaged(tasks, ["tweets", "trec"], ["wasp", "fusegen", "aug-pe"])
    assert set(average) == {"wasp", "fusegen"}  # a method missing on a task has no average
    assert average["wasp"]["seeds"] == [0, 1] and average["wasp"]["macro_f1"] == pytest.approx([0.4, 0.4])
    assert average["wasp"]["label_agreement"] == [None, None]
    paired = grid_report.paired_all(tasks, average, [{"versus": ("wasp", "fusegen")}])
    tweets = paired["tweets"]["wasp − fusegen"]["macro_f1"]
    assert tweets["seeds"] == [0, 1] and tweets["diffs"] == pytest.approx([0.1, 0.3])
    assert tweets["verdict"] == "gap"  # mean 0.2, std 0.14
    mean = paired["average"]["wasp − fusegen"]["macro_f1"]
    assert (
        mean["diffs"] == pytest.approx([0.1, 0.1])
        and "label_agreement" not in paired["average"]["wasp − fusegen"]
    )


def test_label_drift_pools_a_round_over_its_plms_and_pairs_last_with_first_by_seed():
    """issue 22's "label agreement does not fall over the rounds", on made-up round tables."""
    from benchmarks.quality import grid_report

    def entry(rnd: int, plm: str, n: int, agreement: float | None) -> dict:
        return {"round": rnd, "plm": plm, "n": n, "label_agreement": agreement}

    def run(seed: int, last_big: float) -> dict:  # round 0 pools to 0.6; round 2 to (30a + 4) / 40
        rounds = [entry(0, "a", 10, 0.5), entry(0, "b", 10, 0.7), entry(1, "a", 20, 0.0),
                  entry(2, "a", 30, last_big), entry(2, "b", 10, 0.4), entry(2, "c", 0, None)]  # fmt: skip
        return {"task": "trec", "method": "wasp", "seed": seed, "rounds": rounds}

    runs = [run(0, 0.8), run(1, 0.4), {"task": "trec", "method": "only-private", "seed": 0}]
    drift = grid_report.label_drift(runs)
    assert list(drift["trec"]) == ["wasp"]  # a method without rounds has no drift
    wasp = drift["trec"]["wasp"]
    assert wasp["seeds"] == [0, 1] and wasp["diffs"] == pytest.approx([0.1, -0.2])
    assert wasp["verdict"] == "no gap"


def test_the_run_cache_key_holds_new_settings_only_where_they_change_the_run(tmp_path: Path) -> None:
    """A setting added later, at the value that behaves as before it existed, keeps old records
    valid; any other value (or a changed default) is a new key, never a reuse."""
    from benchmarks.quality import harness
    from wasp_vllm.config.run import REMOVED

    data = harness.Data("trec", "validation")
    method = harness.Method("x", "x", "lever", {"strategy": "wasp-no-contrast"})

    def path(**shared) -> Path:  # the settings a benchmark's runs share reach the key via the config
        settings = harness.Settings("vllm", 24, 2, None, tmp_path, config=shared)
        return harness.record_path(method, 0, data, settings)

    as_before = path()
    assert path(later_prompt="few_shot") == as_before
    changed = [path(later_prompt="zero_shot"), path(label_prior="private"), path(far_votes="auto"),
               path(temperature=0.7), path(label_check="off")]  # fmt: skip
    assert len({as_before, *changed}) == 6
    # The settings that left RunConfig at f7b6f4b keep the keys of the records made before: a
    # configuration with them at their last defaults and one without them are the same key. The one
    # list of them is the product's; the four every key holds are among them.
    config = harness.run_config(method, 0, data, harness.Settings("vllm", 24, 2, None, tmp_path)).model_dump()
    unkeyed = REMOVED.difference(harness.REMOVED_IN_KEY)
    assert set(harness.REMOVED_IN_KEY) < REMOVED and len(unkeyed) == 12
    gone = {**harness.REMOVED_IN_KEY, **dict.fromkeys(unkeyed, "its last default")}
    before = harness.key_config({**config, **gone})
    assert harness.key_config({k: v for k, v in config.items() if k not in gone}) == before
    assert {k: before[k] for k in harness.REMOVED_IN_KEY} == harness.REMOVED_IN_KEY
    assert not unkeyed & set(before)
    # Both histograms, as every run released before far_votes existed: the old records stay valid
    # (--far-votes auto makes these two release both, or nothing).
    settings = harness.Settings("vllm", 24, 2, None, tmp_path)
    contrastive = harness.Method("c", "c", "main", {"later_prompt": "contrastive"})
    fusegen = harness.Method("f", "f", "baseline", {"strategy": "fusegen"})  # never votes: no histogram
    for same in (contrastive, fusegen):
        assert "far_votes" not in harness.key_config(harness.run_config(same, 0, data, settings).model_dump())
    config = harness.run_config(harness.Method("w", "w", "main", {}), 0, data, settings).model_dump()
    assert harness.key_config(config)["later_prompt"] == "few_shot"  # WASP's own was contrastive

    assert not harness.out_of_time(method, 0, data, settings, minutes_in=5.0, max_minutes=10.0)
    assert harness.out_of_time(method, 0, data, settings, minutes_in=11.0, max_minutes=10.0)
    as_before.parent.mkdir(parents=True)
    as_before.write_text("{}")  # a finished run is reused whatever the clock says
    assert not harness.out_of_time(method, 0, data, settings, minutes_in=11.0, max_minutes=0.0)


def test_a_run_kept_under_another_method_with_the_same_configuration_is_reused(tmp_path: Path) -> None:
    """A lever whose value became the default (``wasp-uniform-prior`` once the even label split was
    the default) and today's ``wasp`` are one run: ``wasp`` reuses the lever's record under its own
    name. A method whose configuration differs in anything (the private prior, another M) is no twin
    and runs."""
    from benchmarks.quality import harness

    data = harness.Data("trec", "validation")
    wasp = harness.Method("wasp", "WASP", "main", {})
    same = harness.Method("wasp-uniform-prior", "uniform", "lever", {"label_prior": "uniform"})
    other = harness.Method("wasp-private-prior", "private", "lever", {"label_prior": "private"})
    fewer = harness.Method("wasp-uniform-m50", "uniform, M 50", "lever", {"label_prior": "uniform"}, m=50)
    private = harness.Method("only-private", "OnlyPrivate", "baseline", {}, only_private=True)  # runs no PLM
    # the private prior splits the budget in mu^2, which the paper's accountant cannot: no run
    invalid = harness.Method("wasp-bad", "bad", "lever", {"label_prior": "private", "accountant": "paper"})
    settings = harness.Settings("vllm", 24, 2, None, tmp_path, twins=(private, invalid, wasp, same, other))
    alone = harness.Settings("vllm", 24, 2, None, tmp_path)
    harness.record_path(private, 0, data, settings).parent.mkdir(parents=True)
    harness.record_path(private, 0, data, settings).write_text(json.dumps({"macro_f1": 0.9}))

    assert harness.finished_record(wasp, 0, data, settings) is None  # OnlyPrivate's record is no twin
    kept = harness.record_path(same, 0, data, settings)
    kept.write_text(json.dumps({"method": same.key, "label": same.label, "group": "lever", "macro_f1": 0.5}))
    assert harness.finished_record(wasp, 0, data, settings) == kept
    assert harness.finished_record(wasp, 0, data, alone) is None  # twins are the benchmark's methods only
    assert harness.finished_record(other, 0, data, settings) is None
    assert harness.finished_record(fewer, 0, data, harness.Settings("vllm", 24, 2, None, tmp_path,
                                                                    twins=(same,))) is None  # fmt: skip
    assert harness.finished_record(wasp, 1, data, settings) is None  # another seed is another run
    assert not harness.out_of_time(wasp, 0, data, settings, minutes_in=11.0, max_minutes=0.0)

    record, reused = harness.reuse_or_run(wasp, 0, data, settings, pool=None, embedder=None)  # type: ignore[arg-type]
    assert reused and record["macro_f1"] == 0.5
    assert (record["method"], record["label"], record["group"]) == ("wasp", "WASP", "main")
    assert record["cache_key"] == kept.name  # a fresh clone restores it under the key it was kept by


def test_the_one_grid_holds_the_papers_other_studies_beside_the_suite() -> None:
    """Q, the paper's accountant, a larger N and Pre-Text per PLM (once the one-task script's rows)
    are methods of the one grid: each a change to WASP (or to federated WASP's pair) and nothing else."""
    from benchmarks.quality import grid

    table = grid.method_table(300)
    wasp = table["wasp"][0].overrides
    changes: dict[str, dict[str, Any]] = {
        "wasp-q1": {"q": 1},
        "wasp-q16": {"q": 16},
        "wasp-n1200": {"n": 1200},
        "wasp-paper-accountant": {"accountant": "paper"},
    }
    for key, change in changes.items():
        method, pair = table[key]
        assert method.overrides == wasp | change and pair == (key, "wasp") and method.m == 300
    method, pair = table["pre-text:gemma3"]
    assert method.overrides["plms"] == ["gemma3"] and pair == ("wasp-federated", "pre-text:gemma3")


def test_an_experimental_policy_is_its_own_run_and_reaches_the_run_as_an_object(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A round policy registered in policies.py is measured as the method policy-NAME with WASP's
    settings: its record key holds the policy's name (another run, never WASP's twin), a method
    without one keeps the key it had before policies existed, and the run is handed an instance of
    the policy, never a setting."""
    from benchmarks.quality import grid, harness, policies
    from wasp_vllm.api import run_config as api_run_config
    from wasp_vllm.pipeline.policy import DEFAULT_POLICY, PaperPolicy

    @dataclass(frozen=True)
    class StubPolicyForTests(PaperPolicy):  # a stand-in: the harness only hands it on
        name: ClassVar[str] = "stub"

        def vote_request(self, rounds: int) -> tuple[int, ...] | None:  # one vote, after round 0
            return (0,)

    class HandedOverForTests(Exception):
        pass

    handed: dict[str, Any] = {}

    def generate_recording_its_arguments_for_tests(private: str, **kwargs: Any) -> None:
        handed.clear()
        handed.update(kwargs, private=private)
        raise HandedOverForTests

    monkeypatch.setitem(policies.POLICIES, "stub", ("WASP, stub policy", StubPolicyForTests))
    table = grid.method_table(100)
    (method, pair), wasp = table["policy-stub"], table["wasp"][0]
    assert method.policy == "stub" and pair == ("policy-stub", "wasp") and method.overrides == wasp.overrides
    assert "policy" not in wasp.key_fields() and method.key_fields()["policy"] == "stub"
    data = harness.Data("trec", "validation")
    settings = harness.Settings("vllm", 24, 3, None, tmp_path, twins=(wasp,))
    kept = harness.record_path(wasp, 0, data, settings)
    assert harness.record_path(method, 0, data, settings) != kept
    kept.parent.mkdir(parents=True)
    kept.write_text("{}")
    assert harness.finished_record(method, 0, data, settings) is None  # WASP's run is no twin of it

    # The run goes through the public API: wasp_vllm.generate makes the privacy plan for the policy
    # it is handed (tests/test_policy.py), with the run's configuration as the record's key holds it.
    monkeypatch.setattr("wasp_vllm.generate", generate_recording_its_arguments_for_tests)
    pool = type("PoolForTests", (), {"startup_s": {}})()
    with pytest.raises(HandedOverForTests):
        harness.run_one(method, 0, data, settings, pool, embedder="embedder")
    assert isinstance(handed["collaborators"].policy, StubPolicyForTests)
    assert handed["collaborators"].record_throughput is False  # a benchmark's speed is not the machine's
    assert (
        handed["config"] == harness.run_config(method, 0, data, settings)
        and handed["private"] == data.private
    )
    # generate runs that configuration as it is (its S is not fitted again): the run is its record's key
    assert api_run_config(data.private, handed["config"], {}) == handed["config"]
    given = handed["collaborators"]
    assert given.backends.engine_factory is pool and given.backends.embedder == "embedder"
    assert handed["overwrite"] is True
    with pytest.raises(HandedOverForTests):
        harness.run_one(wasp, 0, data, settings, pool, embedder=None)
    assert handed["collaborators"].policy is DEFAULT_POLICY  # the paper's
    with pytest.raises(KeyError, match="no experimental policy 'missing'; registered: .*stub"):
        policies.policy_of("missing")


def test_every_run_of_the_committed_test_grid_is_found_under_the_key_it_was_kept_by() -> None:
    """The headline grid (results/quality_tasks.json, every task, test splits) resumes on a fresh
    clone only while the harness keys each of its runs as it did when the run was kept: the same
    method table, settings and removed-setting values give the same record name, run by run."""
    from benchmarks.quality import grid, harness

    payload = json.loads((BENCH / "results" / "quality_tasks.json").read_text())
    s = payload["settings"]
    table = grid.method_table(s["m"])
    keyed = [r for r in payload["runs"] if "cache_key" in r and not r.get("scored_from")]
    assert len(keyed) > 100
    for run in keyed:
        data = harness.Data(run["task"], s["split"])
        cap = grid.token_cap(run["task"], s["max_new_tokens"])
        settings = harness.Settings(s["engine"], s["n"], s["rounds"], cap, Path("w"), config=s["run_config"])
        kept_by = harness.record_path(table[run["method"]][0], run["seed"], data, settings).name
        assert kept_by == run["cache_key"], run["method"]


def test_a_fresh_clone_resumes_from_the_results_json(tmp_path: Path) -> None:
    """restore_records puts a results JSON's finished runs back under the keys they were kept by, so
    the benchmark finds them; a run without a key, or with a name that leaves the cache, is not."""
    from benchmarks.quality import harness

    data = harness.Data("trec", "test")
    method = harness.Method("x", "x", "lever", {"strategy": "wasp-no-contrast"})
    key = harness.record_path(method, 0, data, harness.Settings("vllm", 24, 2, None, tmp_path / "old")).name
    runs = [
        {"task": "trec", "method": "x", "seed": 0, "macro_f1": 0.5, "cache_key": key, "reused": True},
        {"task": "trec", "method": "y", "seed": 0, "macro_f1": 0.4},  # kept before keys were
        {"task": "trec", "method": "z", "seed": 0, "macro_f1": 0.3, "cache_key": "../../escaped.json"},
    ]
    results = tmp_path / "results.json"
    results.write_text(json.dumps({"runs": runs}))
    fresh = harness.Settings("vllm", 24, 2, None, tmp_path / "fresh" / "trec")
    assert harness.out_of_time(method, 0, data, fresh, minutes_in=1.0, max_minutes=0.0)  # nothing cached

    assert harness.restore_records(results, lambda task: tmp_path / "fresh" / task) == 1
    assert not harness.out_of_time(method, 0, data, fresh, minutes_in=1.0, max_minutes=0.0)  # found
    cached = harness.record_path(method, 0, data, fresh)
    assert json.loads(cached.read_text()) == {k: v for k, v in runs[0].items() if k != "reused"}
    assert [p.name for p in (tmp_path / "fresh" / "trec" / "records").iterdir()] == [key]
    assert not list(tmp_path.rglob("escaped.json"))

    cached.write_text(json.dumps({"macro_f1": 0.9}))  # what the cache holds wins over the JSON
    assert harness.restore_records(results, lambda task: tmp_path / "fresh" / task) == 0
    assert json.loads(cached.read_text()) == {"macro_f1": 0.9}
    assert harness.restore_records(tmp_path / "missing.json", lambda task: tmp_path) == 0


def test_same_label_similarity_is_the_mean_cosine_over_pairs_of_one_label() -> None:
    from benchmarks.quality import round_stats

    vectors = {"a1": [1.0, 0.0], "a2": [2.0, 0.0], "a3": [0.0, 3.0], "b1": [1.0, 1.0], "c1": [0.0, 1.0]}

    class ByText:  # an embedder for pure arithmetic: a fixed vector per text
        def encode(self, texts: list[str]) -> np.ndarray:
            return np.array([vectors[t] for t in texts])

    def rows(*texts: str) -> list[dict]:
        return [{"text": t, "label": t[0]} for t in texts]

    assert round_stats.same_label_similarity(rows("a1", "a2"), ByText()) == pytest.approx(1.0)
    # a: pairs (a1,a2)=1, (a1,a3)=0, (a2,a3)=0; b and c have one sample each, so no pair
    mixed = rows("a1", "a2", "a3", "b1", "c1")
    assert round_stats.same_label_similarity(mixed, ByText()) == pytest.approx(1 / 3)
    assert round_stats.same_label_similarity(rows("b1", "c1"), ByText()) is None


def test_a_replayed_vote_is_matched_to_its_samples_by_id(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from benchmarks.quality import round_stats

    rounds = tmp_path / "private" / "rounds"
    rounds.mkdir(parents=True)
    tables = [pa.table({"id": [a, b], "text": [f"t{a}", f"t{b}"]}) for a, b in (("a", "b"), ("c", "d"))]
    # round 1 voted on its own samples only (voted_samples='newest'), in another order
    pq.write_table(pa.table({"id": ["d", "c"], "h_near": [1.0, 2.0]}), rounds / "votes-001.parquet")
    assert round_stats.voted_samples(tmp_path, tables, 0) is None  # round 0 did not vote
    voted = round_stats.voted_samples(tmp_path, tables, 1)
    assert voted is not None
    samples, votes = voted
    assert samples.column("text").to_pylist() == ["td", "tc"] and votes.num_rows == 2
    pq.write_table(pa.table({"id": ["a", "c"], "h_near": [1.0, 2.0]}), rounds / "votes-000.parquet")
    with pytest.raises(ValueError, match="1 voted ids are no sample written through round 0"):
        round_stats.voted_samples(tmp_path, tables, 0)


class CountingFakeEmbedder:
    """A fake embedder for this unit test of the cache's logic: a text's vector is its length,
    and every text it is asked to embed is counted."""

    dim = 2

    def __init__(self) -> None:
        self.asked: list[str] = []

    def encode(self, texts: list[str]) -> np.ndarray:
        self.asked += texts
        return np.array([[len(t), 1.0] for t in texts], dtype=np.float32)


def test_the_embedding_store_outlives_the_process(tmp_path: Path) -> None:
    """A second benchmark reads the first one's vectors from the store instead of embedding again,
    and embeds only the texts it has not seen; a half-written shard is never read."""
    from benchmarks.quality import harness

    def embedder(fake: CountingFakeEmbedder, spec: str = "fake") -> harness.CachedEmbedder:
        cached = harness.CachedEmbedder(spec, tmp_path / "store")
        cached._inner_model = fake
        return cached

    first = CountingFakeEmbedder()
    one = embedder(first)
    assert one.encode(["a", "bb", "a"]).tolist() == [[1, 1], [2, 1], [1, 1]]
    one.flush()
    (tmp_path / "store" / ".shard-x.npz.1.tmp").write_bytes(b"half")  # an interrupted write
    assert first.asked == ["a", "bb"]
    second = CountingFakeEmbedder()
    two = embedder(second)
    assert two.encode(["bb", "ccc"]).tolist() == [[2, 1], [3, 1]]
    assert second.asked == ["ccc"]
    third = CountingFakeEmbedder()
    embedder(third, "another-model").encode(["a"])  # another model in the same folder: no reuse
    assert third.asked == ["a"]


def test_a_generation_made_for_another_split_is_scored_not_run_again(tmp_path: Path, monkeypatch) -> None:
    """A run's samples do not depend on the split it is scored on: the test grid scores the
    validation grid's generation of the same configuration, unless its run folder has been
    written over since (another run of the method) or is gone."""
    from benchmarks.quality import harness

    wasp = harness.Method("wasp", "WASP", "main", {})
    val, test = harness.Data("trec", "validation"), harness.Data("trec", "test")
    made_here = harness.Settings("vllm", 24, 2, None, tmp_path / "val" / "trec")
    run_dir = made_here.work / "wasp_s0"
    run_dir.mkdir(parents=True)
    manifest = {"timings_s": {"total": 12.5}, "tokens": 900}
    (run_dir / "manifest.json").write_text(json.dumps(manifest))
    (run_dir / "synthetic.parquet").write_bytes(b"")
    kept = harness.record_path(wasp, 0, val, made_here)
    kept.parent.mkdir(parents=True)
    made = {"macro_f1": 0.4, "gen_s": 80.0, "run_dir": str(run_dir), "cache_key": kept.name, **manifest}
    kept.write_text(json.dumps(made))
    here = harness.Settings("vllm", 24, 2, None, tmp_path / "test" / "trec", score_from=(made_here.work,))

    assert harness.generation_elsewhere(wasp, 0, test, here) == (run_dir, manifest, made)
    assert harness.generation_elsewhere(wasp, 1, test, here) is None  # another seed: another generation
    assert harness.generation_elsewhere(wasp, 0, val, here) is None  # the same split is the run cache's job
    assert harness.generation_elsewhere(wasp, 0, test, dataclasses.replace(here, score_from=())) is None
    assert not harness.out_of_time(wasp, 0, test, here, minutes_in=5.0, max_minutes=0.0)  # scoring is no run

    def scored(method, seed, data, out, manifest, embedder, extras=None):  # pure logic: no evaluation here
        assert (data, out) == (test, run_dir)
        return {"macro_f1": 0.6, "run_dir": str(out)}

    monkeypatch.setattr(harness, "score_run", scored)
    monkeypatch.setattr(harness, "run_one", lambda *a, **k: pytest.fail("the generation ran again"))
    record, reused = harness.reuse_or_run(wasp, 0, test, here, pool=None, embedder=None)  # type: ignore[arg-type]
    assert not reused and record["macro_f1"] == 0.6 and record["gen_s"] == 80.0
    assert (
        record["scored_from"] == kept.name
        and record["cache_key"] == harness.record_path(wasp, 0, test, here).name
    )
    assert json.loads(harness.record_path(wasp, 0, test, here).read_text()) == record

    (run_dir / "manifest.json").write_text(json.dumps({**manifest, "tokens": 901}))  # written over since
    assert harness.generation_elsewhere(wasp, 0, test, here) is None
    not_scored_yet = dataclasses.replace(here, work=tmp_path / "test-again" / "trec")
    assert harness.out_of_time(wasp, 0, test, not_scored_yet, minutes_in=5.0, max_minutes=0.0)
    (run_dir / "manifest.json").write_text(json.dumps(manifest))
    (run_dir / "synthetic.parquet").unlink()
    assert harness.generation_elsewhere(wasp, 0, test, here) is None


def test_a_grid_that_stopped_short_never_drops_the_results_it_found(tmp_path, monkeypatch):
    """A results file's finished runs that a grid did not reproduce (skipped for time, or keyed by
    settings that changed since) stay in it: the grid writes ``NAME-partial`` until it has them all."""
    from benchmarks.quality import grid

    def fake_outputs(payload, stem):  # the tables themselves are tested elsewhere
        stem.with_suffix(".json").write_text(json.dumps(payload))
        stem.with_name(stem.name + "_junk.png").write_text("")

    monkeypatch.setattr(grid, "write_outputs", fake_outputs)

    def run(task, method, seed, **more):
        return {"task": task, "method": method, "seed": seed, **more}

    stem = tmp_path / "grid"
    old = {"runs": [run("trec", "wasp", 0), run("trec", "wasp", 1), run("trec", "fusegen", 0, error="x")]}
    stem.with_suffix(".json").write_text(json.dumps(old))
    writer = grid.ResultsWriter(stem)
    short = {"runs": [run("trec", "wasp", 0), run("trec", "fusegen", 0)]}
    assert writer.write(short) == tmp_path / "grid-partial"
    assert json.loads(stem.with_suffix(".json").read_text()) == old
    assert json.loads((tmp_path / "grid-partial.json").read_text()) == short
    assert writer.missing(short) == {("trec", "wasp", 1)}  # the old failed run is no loss
    caught_up = {"runs": [*short["runs"], run("trec", "wasp", 1)]}
    assert writer.write(caught_up) == stem
    assert json.loads(stem.with_suffix(".json").read_text()) == caught_up
    assert not list(tmp_path.glob("grid-partial*"))  # the out-of-date partial tables are gone
    assert grid.ResultsWriter(tmp_path / "new").write(short) == tmp_path / "new"


@pytest.mark.parametrize("name", ["model_dtype", "model_dtype_amx"])  # an AVX2-only CPU, one with AMX
def test_number_type_result_re_renders(tmp_path: Path, name: str) -> None:
    from benchmarks import model_dtype

    saved = BENCH / "results" / f"{name}.json"
    assert model_dtype.main(["--from-json", str(saved), "--out", str(tmp_path), "--name", name]) == 0
    assert (tmp_path / f"{name}.md").read_text() == (BENCH / "results" / f"{name}.md").read_text()
    payload = json.loads(saved.read_text())
    for runs in payload["results"]["runs"].values():  # both types ran every repetition, alternating
        assert len(runs["bfloat16"]) == len(runs["float32"]) == payload["settings"]["reps"]
    assert payload["results"]["auto_picks"] == payload["machine"]["plm_dtype"]


def test_engine_cores_result_re_renders(tmp_path: Path) -> None:
    from benchmarks import engine_cores

    saved = BENCH / "results" / "engine_cores.json"
    assert engine_cores.main(["--from-json", str(saved), "--out", str(tmp_path)]) == 0
    assert (tmp_path / "engine_cores.md").read_text() == (BENCH / "results" / "engine_cores.md").read_text()
    payload = json.loads(saved.read_text())
    for runs in payload["results"]["runs"].values():  # both variants ran every repetition, alternating
        assert len(runs["one held back"]) == len(runs["every core"]) == payload["settings"]["reps"]


def test_engine_processes_result_re_renders(tmp_path: Path) -> None:
    from benchmarks import engine_processes

    saved = BENCH / "results" / "engine_processes.json"
    assert engine_processes.main(["--from-json", str(saved), "--out", str(tmp_path)]) == 0
    rendered = (tmp_path / "engine_processes.md").read_text()
    assert rendered == (BENCH / "results" / "engine_processes.md").read_text()
    payload = json.loads(saved.read_text())
    runs = payload["results"]["runs"]  # both variants ran every repetition, each in a fresh process
    assert [len(v) for v in runs.values()] == [payload["settings"]["reps"]] * 2
    assert max(r["processes_beside_the_run"] for r in runs["in the run's process"]) == 0


def test_the_utility_check_benchmark_counts_coverage_per_m():
    """benchmarks.utility_check: an interval covers when it holds the split's score; the half-width
    is the synthetic set's (the first interval)."""
    from benchmarks.utility_check import KINDS, summarise

    def draw(m: int, truth: float) -> dict:
        k = len(KINDS)
        return {"m": m, "truth": [truth] * k, "low": [0.4] * k, "high": [0.6] * k, "estimate": [0.5] * k}

    out = summarise([draw(100, 0.5), draw(100, 0.7), draw(300, 0.45)])
    assert out["coverage"] == {"100": 0.5, "300": 1.0}
    assert out["half_width"] == {"100": 0.1, "300": 0.1}
    assert out["coverage_by_kind"]["100"] == dict.fromkeys(KINDS, 0.5)


def test_the_utility_check_benchmark_draws_disjoint_records_and_noises_them():
    import numpy as np

    from benchmarks.utility_check import Settings, TaskData, one_draw
    from tests.fakes import HashEmbedderForTests
    from wasp_vllm.tasks import get_task

    rng, task, embedder = np.random.default_rng(0), get_task("drugs"), HashEmbedderForTests()
    d, labels, truth_labels = embedder.dim, np.arange(600) % 3, np.arange(300) % 3
    emb = np.eye(3, d)[labels] * 3 + rng.normal(size=(600, d))
    truth = (np.eye(3, d)[truth_labels] * 3 + rng.normal(size=(300, d)), truth_labels)
    data = TaskData(task, (emb, labels), truth)
    s = Settings(m=(100,), train=200, reference_train=30)
    quiet = one_draw(data, 100, 0, s, sigma=1e-6, embedder=embedder)
    loud = one_draw(data, 100, 0, s, sigma=20.0, embedder=embedder)
    assert quiet["truth"] == loud["truth"] and quiet["truth"][0] > 0.7  # the same models, far above chance
    widths = [np.subtract(d["high"], d["low"]) for d in (quiet, loud)]
    assert (widths[1] > widths[0]).all()  # the noise widens every interval
    assert all(
        lo <= est <= hi for lo, est, hi in zip(quiet["low"], quiet["estimate"], quiet["high"], strict=True)
    )


def test_the_grid_scores_the_label_descriptions_without_a_run(tmp_path: Path) -> None:
    """Issue 75, item 5: every table has the row of the label descriptions alone; it generates
    nothing (no engine, no run folder) and scores the nearest description on the split."""
    from benchmarks.quality import harness
    from benchmarks.quality.grid import DEFAULT_METHODS, QUICK_METHODS, method_table
    from tests.fakes import HashEmbedderForTests

    method = method_table(100)["descriptions"][0]
    assert "descriptions" in DEFAULT_METHODS and "descriptions" in QUICK_METHODS
    assert not method.generates and harness.run_key_config(method, 0, None, None) is None  # type: ignore[arg-type]
    assert "descriptions" not in method_table(100)["wasp"][0].key_fields()  # older methods keep their keys
    settings = harness.Settings("vllm", 24, 2, None, tmp_path)
    data = harness.Data("drugs", "validation")
    record = harness.run_one(method, 0, data, settings, pool=None, embedder=HashEmbedderForTests())  # type: ignore[arg-type]
    assert 0.0 <= record["macro_f1"] <= 1.0 and record["gen_s"] == 0.0 and record["method"] == "descriptions"
    assert not any(tmp_path.iterdir())  # no run folder


def test_the_utility_check_benchmark_reads_real_runs_from_a_grid():
    """The check's estimate on the private records against the split's score, and the macro-F1 its
    share cost, paired by seed (a run without its pair has no cost)."""
    from benchmarks.utility_check import real_runs, real_runs_table

    def check(estimate: float) -> dict:
        interval = {"estimate": estimate, "low": estimate - 0.05, "high": estimate + 0.05}
        return {"sets": [{"name": "synthetic", "macro_f1": interval}]}

    checked = {"task": "trec", "method": "wasp-utility-check"}
    grid = {"settings": {"split": "validation"}, "runs": [
        {"task": "trec", "seed": 0, "method": "wasp", "macro_f1": 0.70},
        checked | {"seed": 0, "macro_f1": 0.68, "utility_check": check(0.72)},
        checked | {"seed": 1, "macro_f1": 0.60, "utility_check": check(0.70)},
        checked | {"seed": 2, "error": "boom"},
    ]}  # fmt: skip
    rows = real_runs(grid)["rows"]
    assert [(r["optimism"], r["covered"], r["cost"]) for r in rows] == [
        (0.04, True, 0.02),
        (0.1, False, None),
    ]
    table = real_runs_table(real_runs(grid) | {"grid": "g.json"}).markdown()
    assert "+0.070 ± 0.030" in table and "50%" in table
