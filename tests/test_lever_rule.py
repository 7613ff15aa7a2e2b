"""The lever adoption rule and its leave-one-task-out check (benchmarks/quality/lever_rule.py): pure logic
on hand-made score tables, no runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.quality import lever_rule


def _table(scores: dict[str, dict[str, list[float]]]) -> dict[str, dict]:
    """``{task: {method: [macro-F1 per seed]}}`` in grid.py's JSON shape."""
    return {
        t: {m: {"seeds": list(range(len(v))), "macro_f1": v} for m, v in ms.items()}
        for t, ms in scores.items()
    }


# the lever gains on a and b, is level on c (inside its spread) and loses beyond its spread on d
GRID = _table({
    "a": {"lever": [0.60, 0.62], "base": [0.50, 0.51]},
    "b": {"lever": [0.55, 0.57], "base": [0.50, 0.50]},
    "c": {"lever": [0.40, 0.46], "base": [0.44, 0.43]},
    "d": {"lever": [0.30, 0.31], "base": [0.35, 0.35]},
})  # fmt: skip


def test_a_lever_worse_beyond_its_spread_on_one_task_is_not_adopted():
    whole = lever_rule.decide(GRID, "lever", "base", ["a", "b", "c", "d"])
    assert not whole["adopt"] and whole["why"].startswith("worse beyond its spread on d")
    assert whole["mean"]["mean"] > 0  # although it wins on the mean
    assert lever_rule.decide(GRID, "lever", "base", ["a", "b", "c"])["adopt"]  # c is inside its spread


def test_a_lever_level_on_the_mean_is_not_adopted_and_missing_rows_refuse():
    level = _table(
        {"a": {"lever": [0.5, 0.6], "base": [0.55, 0.55]}, "b": {"lever": [0.5, 0.5], "base": [0.5, 0.5]}}
    )
    assert lever_rule.decide(level, "lever", "base", ["a", "b"])["why"].startswith("not better on the mean")
    missing = {**GRID, "e": {"base": GRID["a"]["base"]}}
    choice = lever_rule.decide(missing, "lever", "base", ["a", "e"])
    assert not choice["adopt"] and choice["why"] == "no paired rows on e"


def test_leave_one_out_decides_without_the_held_out_task_and_scores_it_on_test():
    test = _table({t: {"base": [0.1 * i, 0.1 * i], "renamed-lever": [0.1 * i + 0.05] * 2}
                   for i, t in enumerate("abcd", start=1)})  # fmt: skip
    rows = lever_rule.leave_one_out(GRID, test, "lever", "base", {"lever": "renamed-lever"})
    adopt = {r["held_out"]: r["adopt"] for r in rows}
    assert adopt == {"a": False, "b": False, "c": False, "d": True}  # only without d does it pass
    by = {r["held_out"]: r for r in rows}
    assert by["d"]["chosen"] == "lever" and by["d"]["test_macro_f1"] == pytest.approx([0.45, 0.45])
    assert by["a"]["chosen"] == "base" and by["a"]["test_macro_f1"] == pytest.approx([0.1, 0.1])
    assert lever_rule.honest_mean(rows) == pytest.approx((0.1 + 0.2 + 0.3 + 0.45) / 4)
    assert lever_rule.fold_agreement(rows) == {"adopting": 1, "folds": 4, "held_out": ["d"]}
    assert lever_rule.honest_mean(lever_rule.leave_one_out(GRID, None, "lever", "base", {})) is None


def test_the_test_split_gain_is_shown_per_task_and_on_the_mean():
    test = _table({t: {"base": [0.1 * i, 0.1 * i + 0.02], "renamed-lever": [0.1 * i + 0.05, 0.1 * i]}
                   for i, t in enumerate("abcd", start=1)})  # fmt: skip
    gain = lever_rule.test_gain(test, "lever", "base", list("abcd"), {"lever": "renamed-lever"})
    assert gain is not None
    assert gain["per_task"]["c"]["diffs"] == pytest.approx([0.05, -0.02])
    assert gain["mean"]["mean"] == pytest.approx(0.015)
    assert gain["base_macro_f1"] == pytest.approx(0.26)  # the default's own mean test score
    assert lever_rule.test_gain(test, "lever", "base", list("abcd"), {}) is None  # no "lever" rows
    assert lever_rule.test_gain(None, "lever", "base", list("abcd"), {}) is None


def test_the_cli_writes_its_tables_and_refuses_an_unknown_pair(tmp_path: Path):
    path = tmp_path / "validation.json"
    path.write_text(json.dumps({"tasks": GRID}))
    lever_rule.main(["--validation", str(path), "--pairs", "lever:base", "--out", str(tmp_path)])
    md = (tmp_path / "lever_rule.md").read_text()
    assert "| d | adopt |" in md and "keep the default (worse beyond its spread on d" in md
    assert "leave-one-out folds that adopt it: 1 of 4 (those holding out d)" in md
    with pytest.raises(SystemExit, match="both methods must be in every task"):
        lever_rule.main(["--validation", str(path), "--pairs", "lever:nothing", "--out", str(tmp_path)])


def test_a_guard_metric_vetoes_a_lever_worse_on_it_and_the_cli_reports_it(tmp_path: Path):
    grid = {t: dict(GRID[t]) for t in ("a", "b", "c")}  # adopted on macro-F1 alone
    agreement = {
        "a": ([0.65, 0.66], [0.6, 0.6]),
        "b": ([0.5, 0.51], [0.6, 0.62]),
        "c": ([0.7, 0.7], [0.7, 0.7]),
    }
    for t, (lever, base) in agreement.items():
        grid[t] = {"lever": {**grid[t]["lever"], "label_agreement": lever},
                   "base": {**grid[t]["base"], "label_agreement": base}}  # fmt: skip
    assert lever_rule.decide(grid, "lever", "base", ["a", "b", "c"])["adopt"]
    guarded = lever_rule.decide(grid, "lever", "base", ["a", "b", "c"], ("label_agreement",))
    assert not guarded["adopt"] and guarded["why"].startswith(
        "worse beyond its spread on b in label agreement"
    )
    assert guarded["guarded"]["label_agreement"]["a"]["verdict"] == "gap"  # better on a: no veto
    path = tmp_path / "validation.json"
    drift = {
        "b": {"lever": {"seeds": [0, 1], "diffs": [-0.1, -0.2], "mean": -0.15, "std": 0.07, "verdict": "gap"}}
    }
    path.write_text(json.dumps({"tasks": grid, "label_drift": drift}))
    argv = ["--validation", str(path), "--pairs", "lever:base", "--out", str(tmp_path)]
    lever_rule.main([*argv, "--guards", "label_agreement"])
    md = (tmp_path / "lever_rule.md").read_text()
    assert "keep the default (worse beyond its spread on b in label agreement" in md
    assert "last round − first, lever against default: b -0.150 ± 0.070 against -" in md
    with pytest.raises(SystemExit, match="--guards: unknown metric fid"):
        lever_rule.main([*argv, "--guards", "fid"])


# issue 59: stage 2 on the held-out group's test splits
HELD = ("products", "vader_tweets", "disaster")


def _held(gains: dict[str, list[float]]) -> dict[str, dict]:
    """Held-out test rows: the base at 0.5 on two seeds, the lever at 0.5 plus each seed's gain."""
    return _table({t: {"lever": [0.5 + g for g in gains[t]], "base": [0.5, 0.5]} for t in gains})


def test_stage_two_keeps_the_old_default_where_the_lever_is_worse_on_a_held_out_task():
    level = _held({"products": [0.01, -0.01], "vader_tweets": [0.02, 0.0], "disaster": [0.0, 0.01]})
    ok = lever_rule.held_out_check(level, "lever", "base", list(HELD), {})
    assert ok["passes"] is True and ok["why"].startswith("not worse than the old default")
    worse = _held({"products": [0.01, -0.01], "vader_tweets": [-0.05, -0.06], "disaster": [0.0, 0.01]})
    check = lever_rule.held_out_check(worse, "lever", "base", list(HELD), {})
    assert check["passes"] is False and "vader_tweets" in check["why"]
    missing = {t: v for t, v in level.items() if t != "disaster"}
    pending = lever_rule.held_out_check(missing, "lever", "base", list(HELD), {})
    assert pending["passes"] is None and pending["why"] == "no paired test rows on disaster"
    adopted = {"adopt": True}
    assert lever_rule.verdict(adopted, ok) == "adopt"
    assert lever_rule.verdict(adopted, check) == "keep the default"
    assert lever_rule.verdict(adopted, pending) == "pending"
    assert lever_rule.verdict({"adopt": False}, ok) == "keep the default"


def test_stage_two_vetoes_a_mean_worse_beyond_its_spread_even_with_no_single_task_worse():
    # each task's loss is inside its own spread, but both seeds lose on the mean over the three
    drift = _held({"products": [-0.05, 0.01], "vader_tweets": [0.01, -0.05], "disaster": [-0.03, 0.02]})
    whole = lever_rule.held_out_check(drift, "lever", "base", list(HELD), {})
    assert all(d["verdict"] == "no gap" for d in whole["per_task"].values())
    assert whole["passes"] is False and whole["why"].endswith("the mean (-0.015 ± 0.012)")


def test_the_cli_refuses_held_out_validation_rows_and_reports_both_stages(tmp_path: Path):
    choosing = {"drugs": GRID["a"], "tweets": GRID["b"], "trec": GRID["c"]}  # the lever passes stage 1
    path = tmp_path / "validation.json"
    path.write_text(json.dumps({"tasks": {**choosing, "products": GRID["a"]}}))
    with pytest.raises(SystemExit, match="held-out group's validation rows \\(products\\)"):
        lever_rule.main(["--validation", str(path), "--pairs", "lever:base", "--out", str(tmp_path)])
    path.write_text(json.dumps({"tasks": choosing}))
    test = tmp_path / "test.json"
    worse = _held({"products": [0.0, 0.01], "vader_tweets": [0.01, 0.0], "disaster": [-0.08, -0.09]})
    test.write_text(json.dumps({"tasks": worse}))
    argv = ["--validation", str(path), "--pairs", "lever:base", "--out", str(tmp_path)]
    lever_rule.main([*argv, "--test", str(test)])
    md = (tmp_path / "lever_rule.md").read_text()
    assert "**the rule: keep the default**" in md
    assert "stage 1, the choosing group's validation splits (drugs, tweets, trec): adopt" in md
    assert "worse than the old default beyond its spread on disaster" in md
    lever_rule.main(argv)  # no test rows yet: stage 1's adoption waits for the held-out group
    assert "**the rule: pending**" in (tmp_path / "lever_rule.md").read_text()
