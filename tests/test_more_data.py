"""The more-data target (benchmarks/quality/more_data.py): pure logic on hand-made score tables, no runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.quality import more_data


def _grid(n: int, scores: dict[str, list[float]]) -> dict:
    """A grid.py JSON at size ``n``: ``{task: [wasp macro-F1 per seed]}``."""
    tasks = {t: {"wasp": {"seeds": list(range(len(v))), "macro_f1": v}} for t, v in scores.items()}
    return {"settings": {"n": n}, "tasks": tasks}


SMALL = _grid(300, {"a": [0.50, 0.52, 0.51], "b": [0.40, 0.42, 0.41], "c": [0.60, 0.61, 0.62],
                    "d": [0.40, 0.38, 0.39], "e": [0.30]})  # fmt: skip
# a gains, b is level inside its spread, c loses beyond its spread, d gains, e has one seed
LARGE = _grid(1200, {"a": [0.55, 0.58, 0.56], "b": [0.43, 0.40, 0.40], "c": [0.55, 0.57, 0.56],
                     "d": [0.45, 0.44, 0.46], "e": [0.20]})  # fmt: skip


def test_the_difference_is_large_minus_small_paired_by_seed():
    rows = more_data.compare(SMALL["tasks"], LARGE["tasks"], "wasp")
    assert rows["a"]["diff"]["diffs"] == pytest.approx([0.05, 0.06, 0.05])
    assert rows["c"]["diff"]["verdict"] == "gap" and rows["c"]["diff"]["mean"] < 0
    assert rows["b"]["diff"]["verdict"] == "no gap"


def test_the_target_needs_enough_tasks_measured_on_enough_seeds_and_no_worse():
    rows = more_data.compare(SMALL["tasks"], LARGE["tasks"], "wasp")
    # a, b, d no worse on three seeds; c worse; e (one seed, lower) is not yet measured
    v = more_data.verdict(rows, tasks=5, need=4, min_seeds=3)
    assert v["status"] == "not yet" and v["worse"] == ["c"] and v["short_of_seeds"] == ["e"]
    assert v["not_worse"] == ["a", "b", "d"]
    assert more_data.verdict(rows, tasks=5, need=3, min_seeds=3)["status"] == "met"
    assert more_data.verdict(rows, tasks=4, need=4, min_seeds=3)["status"] == "not met"  # c cannot be made up
    assert more_data.verdict(rows, tasks=5, need=4, min_seeds=1)["status"] == "met"  # e counts on one seed


def test_it_writes_the_table_and_refuses_sizes_given_the_wrong_way_round(tmp_path: Path):
    small, large = tmp_path / "small.json", tmp_path / "large.json"
    small.write_text(json.dumps(SMALL))
    large.write_text(json.dumps(LARGE))
    more_data.main(["--small", str(small), "--large", str(large), "--out", str(tmp_path)])
    payload = json.loads((tmp_path / "more_data.json").read_text())
    assert payload["verdict"]["status"] == "not yet"
    md = (tmp_path / "more_data.md").read_text()
    assert "| c | 0.610 ± 0.010 | 0.560 ± 0.010 | -0.050 ± 0.010 | 0, 1, 2 | worse |" in md
    assert (
        "| e | 0.300 | 0.200 | -0.100 (no gap) | 0 | no worse |" in md
        and "**not yet**" in md
        and (tmp_path / "more_data.png").stat().st_size > 3000
    )
    with pytest.raises(SystemExit, match="larger N goes to --large"):
        more_data.main(["--small", str(large), "--large", str(small), "--out", str(tmp_path / "x")])
    with pytest.raises(SystemExit, match="no such file"):
        more_data.main(
            ["--small", str(tmp_path / "none.json"), "--large", str(large), "--out", str(tmp_path)]
        )
    assert not (tmp_path / "x").exists()
