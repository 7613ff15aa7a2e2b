"""The Hot PATE yields benchmark without models: the replay of measured positions under each
accountant, and the committed results re-rendered from their JSON."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from benchmarks.hotpate import hotpate_simulate as sim
from benchmarks.hotpate import hotpate_yields

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"


def _walks(mean: float) -> list[dict]:
    rng = np.random.default_rng(0)
    fractions = np.clip(rng.normal(mean, 0.05, (40, 8)), 0.0, 1.0)
    return [{"label": x, "fractions": fractions.tolist(), "record_lengths": [48]} for x in "abc"]


def test_the_old_generator_stopped_when_its_single_ledger_refused():
    out = sim.simulate(_walks(0.8), sim.Scenario("old-gaussian", 8.0, 64, records=4, max_tokens=24))
    assert out.stopped and out.records_written < 4 and out.private == 0  # the 1 record of 4


def test_the_new_gaussian_ledgers_write_every_record_and_spend_at_most_their_caps():
    sc = sim.Scenario("gaussian", 8.0, 67)
    out = sim.simulate(_walks(0.95), sc)
    sigma = sim.gaussian_sigma(67, sim.VOCAB, sc.fraction, sim.BETA)
    cap = sim.gaussian_release_cap(sigma, 2.0, 8.0, 1e-5)
    assert out.records_written == 50 and 0 < out.calls <= 3 * cap and out.private <= out.calls


def test_unanimous_teachers_make_target_charging_win_at_scale_and_not_at_m_600():
    walks = _walks(1.0)
    small = sim.simulate(walks, sim.Scenario("target-charging", 4.0, 67))
    large = sim.simulate(walks, sim.Scenario("target-charging", 4.0, 10000))
    assert small.private == 0 and large.share > 0.9


def test_more_teachers_never_buy_fewer_private_tokens_in_the_replay():
    walks = _walks(0.9)
    shares = [
        sim.mean_outcome(walks, sim.Scenario("gaussian", 4.0, n), seeds=1)["share"] for n in (67, 400, 3000)
    ]
    assert shares == sorted(shares) and shares[-1] > 0.5


def test_committed_results_re_render(tmp_path: Path) -> None:
    saved = BENCH / "results" / "hotpate_yields.json"
    if not saved.exists():
        pytest.skip("no committed results yet")
    hotpate_yields.main(["--from-json", str(saved), "--out", str(tmp_path)])
    md = (tmp_path / "hotpate_yields.md").read_text()
    assert md.splitlines()[2].startswith("Reproduce: `python -m benchmarks.hotpate.hotpate_yields")
    assert json.loads((tmp_path / "hotpate_yields.json").read_text()) == json.loads(saved.read_text())
    assert md == (BENCH / "results" / "hotpate_yields.md").read_text()
    assert (tmp_path / "hotpate_yields.png").stat().st_size > 5000


def test_runs_not_made_again_are_kept_with_the_day_they_ran():
    from benchmarks.hotpate import hotpate_runs

    old = [
        {"accounting": "gaussian", "wall_s": 1},
        {"accounting": "WASP (exact Gaussian)", "ran": "2026-01-02"},
    ]
    kept = hotpate_runs.run_all(600, [], old)
    assert [r["ran"] for r in kept] == [hotpate_runs.RAN_BEFORE_DATES, "2026-01-02"]
    assert [r["accounting"] for r in kept] == ["gaussian", "WASP (exact Gaussian)"]
    with pytest.raises(ValueError, match="unknown runs"):
        hotpate_runs.run_all(600, ["gausian"], old)


def test_an_imported_run_replaces_the_saved_one_of_the_same_command_and_shows_in_its_table():
    from benchmarks.hotpate import hotpate_runs

    row = {"command": "wasp-vllm hotpate --m 2400", "where": "a GPU", "teachers_per_label": 1200,
           "private": 597, "fallback": 1446, "share": 0.29, "epsilon": 4.0, "queries": 920,
           "by_reason": {"abstain": 39, "no_release": 0, "budget": 1407}, "accuracy": 0.56,
           "macro_f1": 0.56, "label_agreement": 0.58, "fid": 0.84, "wall_s": 143,
           "ran": "2026-11-26"}  # fmt: skip
    other = {**row, "command": "wasp-vllm hotpate --m 4800", "share": 0.95}
    merged = hotpate_runs.merge_imported([row, other], [{**row, "share": 0.3}])
    assert [(r["command"], r["share"]) for r in merged] == [(other["command"], 0.95), (row["command"], 0.3)]
    (table,) = hotpate_runs.imported_tables(merged)
    assert [r[0] for r in table.rows] == [other["command"], row["command"]]
    assert "39 / 0 / 1407" in table.rows[1] and "597 / 1446" in table.rows[1]
    assert hotpate_runs.imported_tables([]) == []
