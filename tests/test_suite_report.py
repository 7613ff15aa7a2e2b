"""The tasks grid's report over the suite (benchmarks/quality/grid_report.py, round_stats.py,
harness.py), issue 59: every task named with its group, the group means, kept / generated, the
diversity of each round against round 0, and the signal share of the votes. Pure arithmetic on
made-up runs and a tiny hand-written run folder; no model."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from benchmarks.quality import grid_report, harness, round_stats


def _run(task: str, method: str, seed: int, f1: float, **more) -> dict:
    return {"task": task, "method": method, "seed": seed, "macro_f1": f1, "accuracy": f1,
            "label_agreement": None, "fid": None, "gen_s": 1.0, **more}  # fmt: skip


def test_each_task_carries_its_group_and_each_group_has_its_own_mean():
    scores = {("trec", "wasp"): (0.5, 0.6), ("trec", "fusegen"): (0.4, 0.5),
              ("drugs", "wasp"): (0.3, 0.3), ("drugs", "fusegen"): (0.3, 0.3),
              ("products", "wasp"): (0.7, 0.8), ("products", "fusegen"): (0.8, 0.9)}  # fmt: skip
    runs = [_run(t, m, s, f1s[s]) for (t, m), f1s in scores.items() for s in (0, 1)]
    tasks = grid_report.per_task(runs)
    assert {t: tasks[t]["group"] for t in tasks} == {"trec": "choosing", "drugs": "choosing",
                                                      "products": "held-out"}  # fmt: skip
    names = ["trec", "drugs", "products"]
    means = grid_report.group_means(tasks, names, ["wasp", "fusegen"])
    assert set(means) == {"mean choosing", "mean held-out"}
    assert means["mean choosing"]["wasp"]["macro_f1"] == pytest.approx([0.4, 0.45])
    assert means["mean held-out"]["fusegen"]["macro_f1"] == pytest.approx([0.8, 0.9])
    assert grid_report.group_means(tasks, ["trec", "drugs"], ["wasp"]) == {}  # one group: the average is it
    average = grid_report.averaged(tasks, names, ["wasp", "fusegen"])
    paired = grid_report.paired_all(tasks, average, [{"versus": ("wasp", "fusegen")}], means=means)
    held = paired["mean held-out"]["wasp − fusegen"]["macro_f1"]
    assert held["diffs"] == pytest.approx([-0.1, -0.1]) and held["verdict"] == "gap"
    assert paired["mean choosing"]["wasp − fusegen"]["macro_f1"]["diffs"] == pytest.approx([0.05, 0.05])


def test_kept_share_counts_every_rejected_sample_as_written():
    assert grid_report.kept_share({"kept": 300, "rejects": {"off_label": 256, "prompt_echo": 44}}) == 0.5
    assert grid_report.kept_share({"kept": 10, "rejects": {}}) == 1.0
    assert grid_report.kept_share({"macro_f1": 0.5}) is None  # OnlyPrivate writes nothing
    runs = [_run("trec", "wasp", 0, 0.5, kept=30, rejects={"off_label": 10})]
    assert grid_report.per_task(runs)["trec"]["wasp"]["kept_share"] == [0.75]


def _diversity(cosines: list[float], distinct: list[float]) -> list[dict]:
    return [{"round": t, "n": 60, "same_label_cosine": c, "distinct_2": d, "fid_validation": None,
             "signal_share": None if t == len(cosines) - 1 else 0.1 * (t + 1)}
            for t, (c, d) in enumerate(zip(cosines, distinct, strict=True))]  # fmt: skip


def test_diversity_change_pairs_the_last_round_with_round_zero_and_flags_narrowing():
    runs = [
        _run("trec", "wasp", 0, 0.5, diversity=_diversity([0.30, 0.35, 0.40], [0.8, 0.7, 0.6])),
        _run("trec", "wasp", 1, 0.5, diversity=_diversity([0.20, 0.30, 0.31], [0.7, 0.7, 0.5])),
        # a record kept before the diversity entries: its PLMs' cosines, weighted by their counts
        _run(
            "drugs",
            "wasp",
            0,
            0.5,
            rounds=[
                {"round": 0, "plm": "a", "n": 10, "similarity": 0.2},
                {"round": 0, "plm": "b", "n": 30, "similarity": 0.4},
                {"round": 1, "plm": "a", "n": 20, "similarity": 0.1},
                {"round": 1, "plm": "b", "n": 20, "similarity": 0.3},
            ],
        ),  # fmt: skip
    ]
    change = grid_report.diversity_change(runs)
    cosine = change["trec"]["wasp"]["same_label_cosine"]
    assert cosine["diffs"] == pytest.approx([0.10, 0.11])
    assert grid_report.narrowed("same_label_cosine", cosine)
    distinct = change["trec"]["wasp"]["distinct_2"]
    assert distinct["diffs"] == pytest.approx([-0.2, -0.2]) and grid_report.narrowed("distinct_2", distinct)
    assert "fid_validation" not in change["trec"]["wasp"]  # not measured: no row
    assert change["drugs"]["wasp"]["same_label_cosine"]["diffs"] == pytest.approx([0.2 - 0.35])
    assert set(change["drugs"]["wasp"]) == {"same_label_cosine", "within_plm_cosine"}
    # within a PLM: from the round tables even where diversity entries exist (the mix is left out)
    plms = [(0, "a", 30, 0.2), (0, "b", 30, 0.4), (2, "a", 0, None), (2, "b", 60, 0.5)]
    rounds = [{"round": t, "plm": p, "n": n, "similarity": c} for t, p, n, c in plms]
    within = grid_report.diversity_change([{**runs[0], "rounds": rounds}])["trec"]["wasp"]
    assert within["within_plm_cosine"]["diffs"] == pytest.approx([0.5 - 0.3])
    assert within["same_label_cosine"]["diffs"] == pytest.approx([0.10])
    wider = {"mean": -0.1, "std": 0.01, "verdict": "gap"}
    assert not grid_report.narrowed("same_label_cosine", wider)
    assert grid_report.narrowed("distinct_2", wider)
    assert grid_report.signal_shares(runs) == {"trec": {"wasp": [pytest.approx(0.15), pytest.approx(0.15)]}}


def test_the_written_tables_name_each_task_with_its_group(tmp_path: Path):
    rounds = _diversity([0.2, 0.3], [0.6, 0.5])
    runs = [_run(t, m, s, 0.5 + 0.1 * s, kept=10, rejects={"off_label": 5}, diversity=rounds)
            for t in ("trec", "products") for m in ("wasp", "fusegen") for s in (0, 1)]  # fmt: skip
    methods = [{"key": "fusegen", "label": "FuseGen", "versus": ["wasp", "fusegen"]},
               {"key": "wasp", "label": "WASP", "versus": ["wasp", "wasp"]}]  # fmt: skip
    settings = {"quick": False, "tasks": ["trec", "products"], "split": "test", "engine": "vllm", "n": 300,
                "rounds": 2, "m": 100, "max_new_tokens": None, "seeds": [0, 1], "run_config": {}}  # fmt: skip
    payload = {"command": "python x", "settings": settings, "machine": "test", "methods": methods,
               "n_scored": {"trec": 1, "products": 1}, "reference_junk_share": {}, "runs": runs,
               "ran": [], "reused": [], "skipped": [], "finished": True}  # fmt: skip
    grid_report.write_outputs(payload, tmp_path / "grid")
    saved = json.loads((tmp_path / "grid.json").read_text())
    assert saved["tasks"]["products"]["group"] == "held-out" and saved["tasks"]["trec"]["group"] == "choosing"
    assert saved["tasks"]["products"]["wasp"]["macro_f1"] == pytest.approx([0.5, 0.6])
    md = (tmp_path / "grid.md").read_text()
    heads = "trec (choosing) | products (held-out) | average | mean choosing | mean held-out |"
    assert f"| macro-F1 | {heads}" in md
    assert "| kept / generated |" in md and "0.667 ± 0.000" in md
    assert "| same-label cosine (lower: more diverse) | WASP | +0.100 ± 0.000 **narrower** |" in md
    assert (tmp_path / "grid.png").stat().st_size > 1000


def test_distinct_bigrams_and_signal_share():
    assert round_stats.distinct_bigrams(["a b c", "a b d"]) == pytest.approx(3 / 4)  # (a b) twice
    assert round_stats.distinct_bigrams(["one", ""]) is None
    h = np.array([0.0, 2.0, 4.0, 6.0])  # sample variance 20/3
    assert round_stats.signal_share(h, 1.0) == pytest.approx(1 - 3 / 20)
    assert round_stats.signal_share(h, 10.0) == 0.0  # noise explains more than the spread: floored
    assert round_stats.signal_share(h, None) is None and round_stats.signal_share(h[:1], 1.0) is None


class _Judge(round_stats.ReferenceJudge):
    """The reference judge with made-up validation embeddings (no data set loaded)."""

    def validation_embeddings(self, task_name: str) -> np.ndarray:
        return np.random.default_rng(0).normal(size=(50, 2))


class _Length:  # a fake embedder for this arithmetic: a text's vector is (its length, its words)
    def encode(self, texts: list[str]) -> np.ndarray:
        return np.array([[len(t), len(t.split())] for t in texts], dtype=float)


def _run_folder(tmp_path: Path) -> Path:
    rounds = tmp_path / "private" / "rounds"
    rounds.mkdir(parents=True)
    texts = [["good film", "bad film", "fine one", "dull one"], ["good good", "bad bad", "ok ok", "no no"]]
    for t, batch in enumerate(texts):
        ids = [f"r{t}-{i}" for i in range(4)]
        table = pa.table({"id": ids, "text": batch, "label": ["p", "n", "p", "n"]})
        pq.write_table(table, rounds / f"round-{t:03d}.parquet")
    pq.write_table(pa.table({"id": [f"r0-{i}" for i in range(4)], "h_near": [0.0, 2.0, 4.0, 6.0]}),
                   rounds / "votes-000.parquet")  # fmt: skip
    return tmp_path


def test_round_diversity_reads_each_round_and_its_released_vote(tmp_path: Path):
    run_dir = _run_folder(tmp_path)
    rows = round_stats.round_diversity(run_dir, "rotten_tomatoes", 1.0, _Judge(_Length()))
    assert [r["round"] for r in rows] == [0, 1] and [r["n"] for r in rows] == [4, 4]
    assert rows[0]["signal_share"] == pytest.approx(1 - 3 / 20) and rows[1]["signal_share"] is None
    assert rows[0]["distinct_2"] == 1.0 and rows[1]["distinct_2"] == pytest.approx(1.0)
    assert all(r["fid_validation"] > 0 for r in rows)
    assert rows[0]["same_label_cosine"] == pytest.approx(
        round_stats.same_label_similarity(
            [
                {"text": t, "label": lab}
                for t, lab in zip(["good film", "bad film", "fine one", "dull one"], "pnpn", strict=True)
            ],
            _Length(),
        )  # fmt: skip
    )


def test_a_kept_record_gets_todays_figures_from_its_run_folder_without_running_again(tmp_path: Path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    manifest = {"timings_s": {"generation": 3.0}, "tokens": {"a": 7}}
    (run_dir / "manifest.json").write_text(json.dumps(manifest))
    (run_dir / "synthetic.parquet").write_bytes(b"x")
    record = tmp_path / "record.json"
    record.write_text(json.dumps({"macro_f1": 0.5, "run_dir": str(run_dir), **manifest}))
    calls = []

    def extras(folder: Path, made: dict) -> dict:
        calls.append((folder, made))
        return {"diversity": [{"round": 0}]}

    extras.keys = ("diversity",)  # type: ignore[attr-defined]
    assert harness._with_extras(record, extras)["diversity"] == [{"round": 0}]
    assert calls == [(run_dir, manifest)] and json.loads(record.read_text())["diversity"] == [{"round": 0}]
    assert harness._with_extras(record, extras)["diversity"] == [{"round": 0}] and len(calls) == 1  # kept now
    # a folder holding another generation (a later run wrote there) gives nothing
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"macro_f1": 0.5, "run_dir": str(run_dir), "timings_s": {}, "tokens": {}}))
    assert "diversity" not in harness._with_extras(other, extras) and len(calls) == 1


def test_a_validation_grid_runs_the_choosing_group_and_refuses_a_held_out_task():
    from benchmarks.quality import grid

    assert grid.parse_args(["--split", "validation"]).tasks == [
        "drugs", "rotten_tomatoes", "imdb", "tweets", "trec", "editorials", "conventions"
    ]  # fmt: skip
    assert len(grid.parse_args(["--split", "test"]).tasks) == 10
    with pytest.raises(SystemExit, match="held-out group's validation splits are never looked at"):
        grid.main(["--split", "validation", "--tasks", "trec,disaster"])
