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
    manifest = {"task": "rotten_tomatoes", "privacy": {"plan": {"sigma": 1.0}}}
    rows = round_stats.round_diversity(run_dir, manifest, _Judge(_Length()))
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


def test_relabel_against_reject_on_the_same_samples():
    """Four samples asked for labels 0, 0, 1, 1; the second and fourth read as another label."""
    from benchmarks.quality import relabel

    asked = np.array([0, 0, 1, 1])
    leads = np.array([0.2, -0.1, 0.0, -0.3])  # a lead of 0 is on-label (a tie keeps the sample)
    reads_as = np.array([0, 2, 1, 0])
    judged = np.array([0, 2, 1, 1])  # the reference classifier agrees with the relabelled second
    found = relabel.outcomes(asked, leads, reads_as, judged, generated=8, n_labels=3)
    assert found["reject"] == {"kept_share": 0.25, "label_agreement": 1.0, "largest_label_share": 0.5}
    assert found["relabel"]["kept_share"] == 0.5 and found["relabel"]["label_agreement"] == 0.75
    assert found["relabel"]["largest_label_share"] == 0.5  # labels 0, 2, 1, 0
    assert found["as_written"]["label_agreement"] == 0.75 and found["as_written"]["kept_share"] == 0.5
    # beyond 0.2: the fourth (trailing by 0.3) is relabelled as 0, the second (0.1) is rejected
    beyond = relabel.outcomes(asked, leads, reads_as, judged, 8, 3, margins=[0.2])["relabel beyond 0.2"]
    assert beyond["kept_share"] == 3 / 8 and beyond["label_agreement"] == pytest.approx(2 / 3)
    runs = [{"task": "trec", "seed": s, **relabel.outcomes(asked, leads, reads_as, judged, 8 + s, 3, [0.2])}
            for s in (0, 1)]  # fmt: skip
    per = relabel.summary(runs)["trec"]
    assert per["group"] == "choosing" and per["seeds"] == [0, 1]
    gain = per["relabel − reject"]["kept_share"]
    assert gain["diffs"] == pytest.approx([0.25, 2 / 9]) and gain["verdict"] == "gap"
    assert per["relabel beyond 0.2 − reject"]["kept_share"]["diffs"] == pytest.approx([1 / 8, 1 / 9])
    overall = relabel.overall({"trec": per})
    assert overall["reject"]["label_agreement"] == 1.0
    assert overall["relabel beyond 0.2"]["kept_share"] == pytest.approx((3 / 8 + 3 / 9) / 2)
    assert "as_written − reject" not in per
    with pytest.raises(SystemExit, match="held-out group"):
        relabel.main(["--tasks", "trec,products"])
    with pytest.raises(SystemExit):
        relabel.main(["--margins", "0.1,-1"])
    assert relabel.margin_list("0.01, 0.05") == (0.01, 0.05) and relabel.margin_list("") == ()
    with pytest.raises(SystemExit):
        relabel.main(["--plms", "smollm2,smollm2"])
    # the packaged PLMs' rounds stay where the committed result found them; other PLMs' lie apart
    work = Path("runs")
    assert relabel.run_folder(work, "trec", 1, ("smollm2", "gemma3")) == work / "trec" / "relabel_s1"
    assert relabel.run_folder(work, "trec", 1, ("qwen", "phi")) == work / "trec" / "relabel-qwen+phi_s1"
    assert relabel.zero_shot_round(["qwen"]).overrides["plms"] == ["qwen"]


def test_routing_gives_each_plm_the_labels_it_writes_on_label_within_its_even_share():
    """Two PLMs, two labels: the first writes label 0 on-label 9 times in 10, the second label 1
    8 times in 10; the best routing gives each PLM its label (on-label 0.85 against 0.5 evenly)."""
    from benchmarks.quality import relabel

    plms, asked = ["smollm2"] * 4 + ["gemma3"] * 2, np.array([0, 0, 1, 1, 0, 1])
    assert relabel.plm_label_counts(plms, asked, np.array([1, 1, 0, 1, 0, 1], bool), 2) == [[2, 1], [0, 1]]
    assert relabel.plm_label_counts(plms, asked, np.ones(6, bool), 2) == [[2, 2], [1, 1]]
    rates = np.array([[0.9, 0.3], [0.1, 0.8]])
    assert relabel.best_routing(rates) == pytest.approx(np.array([[0.5, 0.0], [0.0, 0.5]]), abs=1e-9)
    # three labels, two PLMs: every PLM keeps half, every label a third
    x = relabel.best_routing(np.array([[0.9, 0.5, 0.1], [0.2, 0.6, 0.7]]))
    assert x.sum(axis=1) == pytest.approx([0.5, 0.5]) and x.sum(axis=0) == pytest.approx([1 / 3] * 3)
    assert x[0, 0] == pytest.approx(1 / 3) and x[1, 2] == pytest.approx(1 / 3)
    tens = {"plm_label_written": [[10, 10], [10, 10]]}
    as_run = {"plm_label_on": [[9, 3], [1, 8]], "plm_label_agreed": [[9, 0], [0, 4]], **tens}
    other = {"plm_label_on": [[2, 8], [8, 2]], "plm_label_agreed": [[2, 8], [8, 2]], **tens}  # the other way
    found = relabel.routing([{"task": "trec", "seed": 0, **as_run}, {"task": "trec", "seed": 1, **other}])
    assert found["trec"]["even"] == pytest.approx((0.525 + 0.5) / 2)
    assert found["trec"]["agreement, even"] == pytest.approx((13 / 21 + 1.0) / 2)
    assert found["trec"]["routed, same samples"] == pytest.approx((0.85 + 0.8) / 2)
    # each seed routed by the other's rates: the wrong PLM writes each label
    assert found["trec"]["routed by another seed"] == pytest.approx((0.2 + 0.2) / 2)
    # seed 0 routed by seed 1 (first PLM writes label 1, second label 0): none agreed there
    assert found["trec"]["agreement, routed by another seed"] == pytest.approx((0.0 + 1.0) / 2)
    assert found["mean over tasks"] == found["trec"]


def test_a_finished_relabel_round_is_read_back_and_one_of_other_settings_written_again(tmp_path: Path):
    """``write_round``'s logic, with a stand-in for the run (no engine): resume first; a folder of
    other settings (the run refuses to resume it) is overwritten."""
    from benchmarks.quality import relabel
    from wasp_vllm.config import ConfigError

    calls: list[dict[str, bool]] = []

    class StandInRun:  # records how it was asked to run; refuses a resume where told to
        def __init__(self, other_settings: bool) -> None:
            self.other_settings = other_settings

        def execute(self, *, resume: bool = False, overwrite: bool = False) -> StandInRun:
            calls.append({"resume": resume, "overwrite": overwrite})
            if resume and self.other_settings:
                raise ConfigError("the folder holds a run of other settings")
            return self

        def to_json(self) -> dict:
            return {"calls": len(calls)}

    assert relabel.write_round(lambda: StandInRun(False), tmp_path) == {"calls": 1}
    assert calls == [{"resume": True, "overwrite": False}]  # read back: nothing written again
    calls.clear()
    assert relabel.write_round(lambda: StandInRun(True), tmp_path) == {"calls": 2}
    assert calls == [{"resume": True, "overwrite": False}, {"resume": False, "overwrite": True}]


def test_a_second_reader_seconds_or_vetoes_the_label_check():
    """The reader ways, on the four samples above: the reader reads them as 0, 1, 2, 1."""
    from benchmarks.quality import relabel

    asked, leads, reads_as = np.array([0, 0, 1, 1]), np.array([0.2, -0.1, 0.0, -0.3]), np.array([0, 2, 1, 0])
    judged = np.array([0, 2, 1, 1])
    found = relabel.outcomes(asked, leads, reads_as, judged, 8, 3, reader=np.array([0, 1, 2, 1]))
    # every off-label sample under the reader's label: the second as 1, the fourth as 1
    assert found["reader relabel"]["kept_share"] == 0.5 and found["reader relabel"]["label_agreement"] == 0.75
    # the second is rejected: the reader names neither its asked label (0) nor the check's (2)
    seconds = found["reader seconds"]
    assert seconds == {"kept_share": 3 / 8, "label_agreement": 1.0, "largest_label_share": 2 / 3}
    # and the third, on-label, is vetoed: the reader reads it as 2
    assert found["reader vets"]["kept_share"] == 2 / 8 and found["reader vets"]["label_agreement"] == 1.0
    # where the reader cannot read (-1), the label check's label stands: the second as 2
    unread = relabel.outcomes(asked, leads, reads_as, judged, 8, 3, reader=np.array([0, -1, 2, 1]))
    assert unread["reader relabel"]["label_agreement"] == 1.0
    assert "reader relabel" not in relabel.outcomes(asked, leads, reads_as, judged, 8, 3)


def test_the_second_reader_reads_by_the_nearest_centroid_of_the_other_on_label_samples():
    """Three labels along three axes of 40; label 2 has one on-label sample, which sits on label
    2's axis: with itself in its centroid it would vouch for itself."""
    from benchmarks.quality import relabel

    rng = np.random.default_rng(0)
    asked = np.array([0] * 8 + [1] * 8 + [2, 2])
    embeddings = rng.normal(size=(18, 40)) * 0.3
    embeddings[np.arange(18), asked] += 3.0
    embeddings[0, :3] = [0.0, 3.0, 0.0]  # asked for 0 and passed the check, but reads like label 1
    on = np.ones(18, dtype=bool)
    on[17] = False  # off-label, asked for 2: label 2 keeps a single on-label sample (16)
    read = relabel.read_by_own_samples(embeddings, asked, on, n_labels=3)
    assert (read[1:8] == 0).all() and (read[8:16] == 1).all() and read[0] == 1
    assert read[17] == 2  # off-label: read against every centroid, label 2's (sample 16) included
    assert read[16] in (0, 1)  # its own label has no centroid without it
    # one label among the on-label samples: nothing to read against
    assert (relabel.read_by_own_samples(embeddings, np.zeros(18, dtype=int), on, 3) == -1).all()


def test_a_validation_grid_runs_the_choosing_group_and_refuses_a_held_out_task():
    from benchmarks.quality import grid

    assert grid.parse_args(["--split", "validation"]).tasks == [
        "drugs", "rotten_tomatoes", "imdb", "tweets", "trec", "editorials", "conventions"
    ]  # fmt: skip
    assert len(grid.parse_args(["--split", "test"]).tasks) == 10
    with pytest.raises(SystemExit, match="held-out group's validation splits are never looked at"):
        grid.main(["--split", "validation", "--tasks", "trec,disaster"])
