"""The utility check (issue 76): after the last round, noisy confusion matrices of three task models
on the private records (trained on the synthetic set, on round 0's zero-shot samples, and the
nearest label description), paid for in the run's one plan and ledger, read into macro-F1 and
accuracy with intervals.

The mechanism tests use real noise from a real secret on random public stand-ins for records; the
run tests use ``FakeEngineForUnitTests`` and ``HashEmbedderForTests`` (named as such: the subject is
the release and what is published, not an LLM).
"""

from __future__ import annotations

import itertools
import json
import math

import numpy as np
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from tests.fakes import FakeEngineForUnitTests, HashEmbedderForTests, use_fake_backends
from tests.test_reliability import settings, write_private
from wasp_vllm.cli import app
from wasp_vllm.config import ConfigError, RunConfig, build_config
from wasp_vllm.pipeline import Run, prepare
from wasp_vllm.privacy.accountant import EXACT, UnplannedRelease
from wasp_vllm.privacy.mechanisms import CentralVoting, clean_confusion
from wasp_vllm.privacy.plan import UTILITY_CHECK, BudgetShares, PrivacyUnit, plan_privacy
from wasp_vllm.privacy.secrets import RunSecret
from wasp_vllm.privacy.utility import CHECKED_SETS, figures, macro_f1
from wasp_vllm.privacy.voting import Voters
from wasp_vllm.report.page import render_report


def _plan(neighbour: str = "add_remove", share: float = 0.2):
    return plan_privacy(
        4.0, 1e-5, 3, 2, unit=PrivacyUnit(neighbour), shares=BudgetShares(utility_check=share)
    )


def test_the_check_is_one_release_of_the_plan_and_its_sensitivity_is_the_worst_case():
    plan = _plan()
    assert plan.utility_sigma is not None and plan.utility_sensitivity == pytest.approx(math.sqrt(3))
    assert _plan("replace").utility_sensitivity == pytest.approx(math.sqrt(6))
    releases = plan.planned_releases()
    assert [r.what for r in releases] == ["votes", "votes", UTILITY_CHECK] and releases[-1].round == 2
    assert EXACT.epsilon(list(releases), 1e-5) == pytest.approx(4.0, rel=1e-6)  # the whole budget, once
    # Brute force over records of 3 labels: adding one moves one cell of each of the 3 matrices by
    # 1; replacing one moves two cells of each.
    cells = list(itertools.product(range(3), repeat=4))  # (label, three predictions)

    def vector(record: tuple[int, ...]) -> np.ndarray:
        y, *predicted = record
        return np.concatenate([clean_confusion(np.array([y]), np.array([p]), 3).ravel() for p in predicted])

    added = max(np.linalg.norm(vector(r)) for r in cells)
    replaced = max(np.linalg.norm(vector(a) - vector(b)) for a in cells[:9] for b in cells)
    assert added == pytest.approx(plan.utility_sensitivity)
    assert replaced == pytest.approx(_plan("replace").utility_sensitivity)


def test_the_released_matrices_carry_the_planned_noise_and_are_paid_for_first():
    """Many labels, many records: the residuals' spread pins sigma to a few per cent (a check that
    publishes the clean matrices, or noises them less, fails here)."""
    rng = np.random.default_rng(0)
    n_labels, n = 40, 30_000
    labels = rng.integers(0, n_labels, n)
    embeddings = rng.standard_normal((n, n_labels)).astype(np.float32) + 3 * np.eye(n_labels)[labels]
    plan = _plan()
    ledger = plan.open_ledger()
    voting = CentralVoting(Voters(embeddings, labels), 2, plan, RunSecret.generate(), ledger)
    models = [
        lambda e: e.argmax(axis=1),
        lambda e: e[:, ::-1].argmax(axis=1),
        lambda e: np.zeros(len(e), int),
    ]
    noisy = voting.release_confusions(models, n_labels)
    clean = np.stack([clean_confusion(labels, m(embeddings), n_labels) for m in models])
    residual = noisy - clean
    assert abs(residual.std() / plan.utility_sigma - 1) < 0.05  # about 5 standard errors
    assert abs(residual.mean()) < 4 * plan.utility_sigma / np.sqrt(residual.size)
    assert [r.what for r in ledger.releases] == [UTILITY_CHECK]
    with pytest.raises(UnplannedRelease, match="already recorded"):
        voting.release_confusions(models, n_labels)
    with pytest.raises(ValueError, match="planned for 3 matrices"):
        voting.release_confusions(models[:2], n_labels)


def test_the_figures_and_their_intervals_read_the_noisy_matrices():
    truth = np.array([[40.0, 10, 0], [5, 30, 5], [0, 10, 40]])
    everything_first = np.zeros((3, 3))
    everything_first[:, 0] = truth.sum(axis=1)  # the same records, all read as the first label
    exact = figures(np.stack([truth, truth * 0.5, everything_first]), sigma=1e-6)
    synthetic = exact.sets[0]
    assert [s.name for s in exact.sets] == list(CHECKED_SETS)
    assert synthetic.macro_f1.estimate == pytest.approx(macro_f1(truth), abs=1e-4)
    assert synthetic.accuracy.estimate == pytest.approx(110 / 140, abs=1e-4)
    assert synthetic.macro_f1.low < synthetic.macro_f1.estimate < synthetic.macro_f1.high  # sampling error
    assert exact.lead_over_descriptions.low > 0 and "above the label descriptions" in exact.reading()
    noisy = figures(np.stack([truth] * 3) + np.random.default_rng(1).normal(0, 8, (3, 3, 3)), sigma=8.0)
    width = noisy.sets[0].macro_f1.high - noisy.sets[0].macro_f1.low
    assert width > synthetic.macro_f1.high - synthetic.macro_f1.low  # the DP noise widens it
    assert "level with" in noisy.reading() and not noisy.zero_shot_better
    worse = figures(np.stack([everything_first, truth, truth]), sigma=1e-6)
    assert worse.zero_shot_better and "adds nothing here" in worse.reading()
    again = type(noisy).from_json(json.loads(json.dumps(noisy.to_json())))
    assert again == noisy


def test_a_run_with_the_check_publishes_its_figures_and_spends_the_budget_once(tmp_path, monkeypatch):
    use_fake_backends(monkeypatch)
    private = write_private(tmp_path / "p.csv", n=30)
    argv = ["generate", "--plms", "a,b", "--private", str(private), "--n", "36", "--rounds", "3", "--q", "2",
            "--s", "2", "--utility-check-share", "0.2", "--out", str(tmp_path / "out")]  # fmt: skip
    plan = CliRunner().invoke(app, [*argv, "--dry-run"], env={"COLUMNS": "200"})
    assert plan.exit_code == 0 and "utility check" in plan.output, plan.output
    result = CliRunner().invoke(app, argv, env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "utility check on your records" in result.output and "the synthetic set is" in result.output
    privacy = json.loads((tmp_path / "out" / "manifest.json").read_text())["privacy"]
    check, ledger = privacy["utility_check"], privacy["ledger"]
    assert [s["name"] for s in check["sets"]] == list(CHECKED_SETS)
    assert check["sigma"] == privacy["plan"]["utility_sigma"]
    assert ledger["compositions"] == 3 and ledger["epsilon_spent_exact"] == pytest.approx(4.0, rel=1e-6)
    matrices = np.array(check["noisy_confusions"])
    assert matrices.shape == (3, 3, 3) and not np.allclose(matrices, np.round(matrices))  # noised
    card = (tmp_path / "out" / "README.md").read_text()
    assert "Utility check on the private records" in card and "zero-shot reference" in card
    page = render_report(tmp_path / "out")
    assert (
        "Utility check on the private records" in page.read_text() and (page.parent / "utility.png").is_file()
    )


def _killed_before_the_check(state) -> None:
    raise KeyboardInterrupt  # Ctrl-C between the last round and the check


def test_a_run_killed_after_its_rounds_makes_the_check_on_resume(tmp_path):
    private = write_private(tmp_path / "p.csv", n=24)
    cfg = RunConfig(**settings(private, plms=["a"], n=24, rounds=2, utility_check_share=0.2, noise_seed=None))

    def run() -> Run:
        return Run(prepare(cfg), tmp_path / "out", engine_factory=lambda n, c: FakeEngineForUnitTests(n),
                   embedder=HashEmbedderForTests())  # fmt: skip

    killed = run()
    killed._utility_check = _killed_before_the_check
    with pytest.raises(KeyboardInterrupt):
        killed.execute()
    assert not (tmp_path / "out" / "manifest.json").exists()
    manifest = run().execute(resume=True)
    assert manifest.privacy.utility_check is not None and manifest.privacy.compositions == 2


@pytest.mark.parametrize(
    "extra, why",
    [({"accountant": "paper"}, "exact accountant"), ({"parties": 3, "strategy": "pre-text"}, "no parties")],
)
def test_the_check_is_refused_where_it_cannot_be_made(extra, why):
    with pytest.raises(ConfigError, match=why):
        build_config({"utility_check_share": 0.2, **extra}, {})


def test_publish_better_publishes_round_0_alone_where_the_check_finds_it_better(tmp_path, monkeypatch):
    """The decision reads the noisy figures alone; here they are made to say zero-shot is better."""
    import wasp_vllm.pipeline.manifest as manifest_module

    truth, everything_first = np.diag([10.0, 10.0, 10.0]), np.zeros((3, 3))
    everything_first[:, 0] = 10.0
    zero_shot_ahead = figures(np.stack([everything_first, truth, truth]), sigma=1e-6)
    monkeypatch.setattr(manifest_module, "figures", lambda *a, **k: zero_shot_ahead)
    use_fake_backends(monkeypatch)
    private = write_private(tmp_path / "p.csv", n=30)
    argv = ["generate", "--plms", "a,b", "--private", str(private), "--n", "36", "--rounds", "3", "--q", "2",
            "--s", "2", "--utility-check-share", "0.2"]  # fmt: skip
    published = {}
    for choice in ("--publish-better", "--publish-all"):
        out = tmp_path / choice
        result = CliRunner().invoke(app, [*argv, choice, "--out", str(out)], env={"COLUMNS": "200"})
        assert result.exit_code == 0, result.output
        rounds = pq.read_table(out / "synthetic.parquet").column("round").to_pylist()
        manifest = json.loads((out / "manifest.json").read_text())
        published[choice] = (set(rounds), manifest["privacy"]["utility_check"]["published"])
        assert manifest["output"]["rows"] == len(rounds)
    assert published["--publish-better"] == ({0}, "zero-shot reference")
    assert published["--publish-all"] == ({0, 1, 2}, "synthetic")
    card = (tmp_path / "--publish-better" / "README.md").read_text()
    assert "round 0's zero-shot samples alone (--publish-better)" in card


def test_publish_better_needs_the_check():
    with pytest.raises(ConfigError, match="utility_check_share"):
        build_config({"publish_better": True}, {})
