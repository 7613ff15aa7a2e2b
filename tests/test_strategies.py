"""Baselines and variants as strategies of the same round loop (fake engine: pipeline logic only)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from tests.test_pipeline import WORDS, make_cfg, run
from wasp_vllm.pipeline import prepare


@pytest.fixture()
def private_csv(tmp_path: Path) -> Path:
    rng = np.random.default_rng(1)
    rows = ["text,label,user"]
    for i in range(40):
        label = ["positive", "neutral", "negative"][i % 3]
        rows.append(f"record {i} {' '.join(rng.choice(WORDS, size=8))},{label},u{i % 10}")
    path = tmp_path / "private.csv"
    path.write_text("\n".join(rows) + "\n")
    return path


def kinds_by_round(out: Path) -> dict[int, set[str]]:
    table = pq.read_table(out / "synthetic.parquet")
    found: dict[int, set[str]] = {}
    for r, k in zip(table.column("round").to_pylist(), table.column("prompt_kind").to_pylist(), strict=True):
        found.setdefault(r, set()).add(k)
    return found


def test_fusegen_spends_no_privacy_and_never_votes(tmp_path, private_csv, embedder):
    manifest = run(make_cfg(private_csv, strategy="fusegen"), tmp_path / "o", embedder)
    assert manifest["privacy"]["ledger"]["compositions"] == 0
    assert manifest["privacy"]["ledger"]["epsilon_spent_exact"] == 0
    assert manifest["privacy"]["plan"]["sigma"] is None
    assert kinds_by_round(tmp_path / "o") == {0: {"zero_shot"}, 1: {"zero_shot"}, 2: {"zero_shot"}}
    assert all(r["weights_after"] == [0.5, 0.5] for r in manifest["rounds"])


def test_aug_pe_votes_top1_with_one_plm_and_variation_prompts(tmp_path, private_csv, embedder):
    manifest = run(make_cfg(private_csv, strategy="aug-pe", plms=["a"]), tmp_path / "o", embedder)
    assert manifest["privacy"]["plan"]["q"] == 1
    assert manifest["privacy"]["plan"]["sensitivity"] == pytest.approx(np.sqrt(2.0))  # Top-1 near + far
    assert manifest["privacy"]["plan"]["histograms"] == 2
    assert kinds_by_round(tmp_path / "o")[2] == {"few_shot"}
    with pytest.raises(ValueError, match="exactly one PLM"):
        make_cfg(private_csv, strategy="aug-pe")


def test_ablations_change_prompts_and_weights(tmp_path, private_csv, embedder):
    no_contrast = run(make_cfg(private_csv, strategy="wasp-no-contrast"), tmp_path / "nc", embedder)
    assert kinds_by_round(tmp_path / "nc")[2] == {"few_shot"}
    assert no_contrast["privacy"]["ledger"]["compositions"] == 2  # two votes
    fixed = run(make_cfg(private_csv, strategy="wasp-no-weighting"), tmp_path / "nw", embedder)
    assert all(r["weights_after"] == [0.5, 0.5] for r in fixed["rounds"])


def test_paper_accountant_adds_more_noise_for_the_same_budget(tmp_path, private_csv, embedder):
    exact = prepare(make_cfg(private_csv)).plan
    paper = prepare(make_cfg(private_csv, accountant="paper")).plan
    assert paper.sigma > 2 * exact.sigma
    assert paper.epsilon_exact_spent < exact.epsilon_exact_spent <= 4 + 1e-9


def test_federated_run_records_both_guarantees(tmp_path, private_csv, embedder):
    manifest = run(make_cfg(private_csv, parties=4, tolerance=1), tmp_path / "o", embedder)
    fed = manifest["privacy"]["federated"]
    assert fed["parties"] == 4 and fed["tolerance"] == 1
    assert "coalition" in fed["guarantee"] or "coalition" in str(fed)
    assert manifest["privacy"]["ledger"]["epsilon_spent_exact"] <= 4 + 1e-9
    assert pq.read_table(tmp_path / "o" / "synthetic.parquet").num_rows == 36


def test_pre_text_is_federated_top1(tmp_path, private_csv, embedder):
    manifest = run(make_cfg(private_csv, strategy="pre-text", parties=4), tmp_path / "o", embedder)
    assert manifest["privacy"]["plan"]["q"] == 1 and "federated" in manifest["privacy"]
    with pytest.raises(ValueError, match="federated"):
        make_cfg(private_csv, strategy="pre-text")


def test_user_level_privacy_uses_the_public_cap(tmp_path, private_csv):
    record = prepare(make_cfg(private_csv, user_col="user")).plan
    ctx = prepare(make_cfg(private_csv, user_col="user", privacy_unit="user", max_records_per_user=3))
    assert ctx.plan.sensitivity == pytest.approx(3 * record.sensitivity)  # the cap, not the data's 4
    assert ctx.plan.sigma > record.sigma
    assert np.unique(ctx.private.users, return_counts=True)[1].max() == 3  # 4 per user, 3 kept
    with pytest.raises(ValueError, match="max_records_per_user"):
        make_cfg(private_csv, user_col="user", privacy_unit="user")


def test_removing_a_heavy_user_moves_the_real_votes_by_at_most_the_sensitivity(tmp_path):
    """What the cap is for: the accountant's sensitivity must bound the real vote vector's move."""
    from tests.fakes import HashEmbedderForTests
    from wasp_vllm.privacy.voting import clean_histograms

    rng = np.random.default_rng(4)
    rows = [f"record {i} {' '.join(rng.choice(WORDS, size=8))},{['positive', 'negative'][i % 2]},"
            f"{'heavy' if i < 12 else f'u{i}'}" for i in range(40)]  # fmt: skip
    full, without = tmp_path / "full.csv", tmp_path / "without.csv"
    full.write_text("text,label,user\n" + "\n".join(rows) + "\n")
    without.write_text("text,label,user\n" + "\n".join(r for r in rows if not r.endswith(",heavy")) + "\n")
    embedder = HashEmbedderForTests()
    synth = [f"synthetic {' '.join(rng.choice(WORDS, size=6))}" for _ in range(60)]
    synth_emb, synth_labels = embedder.encode(synth), np.arange(60) % 2

    def votes(path):
        ctx = prepare(
            make_cfg(path, user_col="user", privacy_unit="user", max_records_per_user=2, q=4, n=300)
        )
        emb = embedder.encode(ctx.private.texts)
        return np.concatenate(clean_histograms(emb, ctx.private.labels, synth_emb, synth_labels, 4)), ctx.plan

    (a, plan), (b, _) = votes(full), votes(without)
    assert 0 < np.linalg.norm(a - b) <= plan.sensitivity * (1 + 1e-12)


def test_the_later_prompt_is_resolved_in_the_settings_and_used_by_the_loop(tmp_path, private_csv, embedder):
    from wasp_vllm.config import ConfigError, RunConfig, build_settings
    from wasp_vllm.strategies import AUTO_LATER_PROMPT

    assert (
        RunConfig().later_prompt == AUTO_LATER_PROMPT.value
    )  # 'auto' is resolved: the manifest says what ran
    assert RunConfig(strategy="wasp-no-contrast").later_prompt == "few_shot"  # the ablation keeps its own
    assert RunConfig(strategy="fusegen").later_prompt == "zero_shot"
    with pytest.raises(ConfigError, match="aug-pe always uses few_shot"):
        build_settings(RunConfig, {"strategy": "aug-pe", "plms": ["a"], "later_prompt": "contrastive"})
    for later in ("few_shot", "contrastive"):
        out = tmp_path / later
        manifest = run(make_cfg(private_csv, later_prompt=later), out, embedder)
        assert manifest["config"]["later_prompt"] == later
        assert kinds_by_round(out)[2] == {later}  # the last round, once the votes filled the pools


def test_later_prompt_choices_are_auto_and_the_task_files_prompt_kinds():
    from typing import get_args

    from wasp_vllm.config.roles import LaterPrompt
    from wasp_vllm.tasks.spec import PROMPT_KINDS

    assert sorted(get_args(LaterPrompt)) == sorted(("auto", *PROMPT_KINDS))
