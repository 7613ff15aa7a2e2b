"""The round-policy seam: a policy handed to ``Run`` decides the pools, the PLM weights and which
samples are kept; it sees the published noisy votes and public samples only; the paper's policy is
the default and is not named in the manifest; a run file cannot reach a removed lever.

Generation comes from ``FakeEngineForUnitTests`` and embeddings from ``HashEmbedderForTests``: the
subject is the loop's use of the policy, not an LLM.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.fakes import FakeEngineForUnitTests, HashEmbedderForTests
from tests.privacy_checks import private_texts
from wasp_vllm.config import ConfigError, RunConfig, build_config
from wasp_vllm.pipeline import Run, prepare
from wasp_vllm.pipeline.estimate import plan_run
from wasp_vllm.pipeline.policy import ChosenPools, PaperPolicy, VotedSamples, planned_votes
from wasp_vllm.pipeline.store import RunStore
from wasp_vllm.privacy.voting import NoisyVotes

LABELS = ["positive", "neutral", "negative"]


class LeastVotedPolicyForTests(PaperPolicy):
    """An experiment as the harness would hand one: the good pool is the *least* voted samples,
    PLM weights are fixed at 0.8 / 0.2, and samples naming 'sleep' are turned down. Records what
    it was shown, so the test can compare it with what the run published."""

    name = "least-voted-for-tests"

    def __init__(self) -> None:
        self.seen: list[tuple[np.ndarray, list[str], np.ndarray]] = []

    def pools(self, votes: NoisyVotes, samples: VotedSamples, s: int) -> ChosenPools:
        self.seen.append((votes.h_near.copy(), list(samples.texts), samples.rounds.copy()))
        good = {}
        for label in range(samples.n_labels):
            rows = np.flatnonzero(samples.labels == label)
            good[label] = rows[np.argsort(votes.h_near[rows], kind="stable")][:s]
        return ChosenPools(good=good, bad={label: rows[:0] for label, rows in good.items()})

    def plm_weights(self, votes: NoisyVotes, samples: VotedSamples, previous: np.ndarray) -> np.ndarray:
        return np.array([0.8, 0.2])

    def reject(self, text: str, label: str, prompt: str) -> str | None:
        return "mentions_sleep" if "sleep" in text else None


def _settings(tmp_path) -> dict:
    private = tmp_path / "p.csv"
    rows = [f"{t},{LABELS[i % 3]}" for i, t in enumerate(private_texts(30, seed=5))]
    private.write_text("text,label\n" + "\n".join(rows) + "\n")
    return dict(plms=["a", "b"], task="drugs", private=str(private), private_limit=None, n=60, rounds=3,
                q=2, s=2, noise_seed=1, concurrent=False)  # fmt: skip


def _run(cfg: RunConfig, out, policy=None, **kw):
    extra = {} if policy is None else {"policy": policy}
    return Run(prepare(cfg, **extra), out, engine_factory=lambda name, c: FakeEngineForUnitTests(name),
               embedder=HashEmbedderForTests()).execute(**kw).to_json()  # fmt: skip


def test_a_policy_chooses_pools_weights_and_rejects_from_the_published_votes(tmp_path):
    cfg = RunConfig(**_settings(tmp_path))
    policy = LeastVotedPolicyForTests()
    manifest = _run(cfg, tmp_path / "out", policy)
    assert manifest["policy"] == policy.name
    # It was shown exactly the noisy votes the run published, over D so far.
    assert len(policy.seen) == cfg.rounds - 1
    out = tmp_path / "out"
    for t, (h_near, texts, rounds) in enumerate(policy.seen):
        published = pq.read_table(next(out.rglob(f"votes-{t:03d}.parquet")))
        np.testing.assert_array_equal(h_near, published.column("h_near").to_numpy())
        assert len(texts) == published.num_rows
        written = [pq.read_table(next(out.rglob(f"round-{r:03d}.parquet"))).num_rows for r in range(t + 1)]
        assert rounds.tolist() == [r for r, k in enumerate(written) for _ in range(k)]  # each sample's round
    # Its weights and its rejects reached the loop.
    for record in manifest["rounds"][: cfg.rounds - 1]:
        assert record["weights_after"] == pytest.approx([0.8, 0.2])
    table = pq.read_table(out / "synthetic.parquet")
    assert not any("sleep" in t for t in table.column("text").to_pylist())
    assert any(r["rejects"].get("a", {}).get("mentions_sleep") for r in manifest["rounds"])
    # Its pools (the least voted samples) are what the state keeps for the next round.
    state = RunStore(out).load_state()
    h_last, texts_last, _ = policy.seen[-1]
    synth = pa.concat_tables([pq.read_table(p) for p in sorted(out.rglob("round-*.parquet"))[:2]])
    labels = synth.column("label").to_pylist()
    for label, pool in state.pools.good.items():
        rows = [i for i, lab in enumerate(labels) if lab == label]
        least = sorted(rows, key=lambda i: h_last[i])[: cfg.s]
        assert pool == [texts_last[i] for i in least]


def test_the_papers_policy_is_the_default_and_goes_unnamed(tmp_path):
    cfg = RunConfig(**_settings(tmp_path))
    default = _run(cfg, tmp_path / "default")
    paper = _run(cfg, tmp_path / "paper", PaperPolicy())
    assert "policy" not in default and "policy" not in paper
    a, b = (pq.read_table(tmp_path / d / "synthetic.parquet") for d in ("default", "paper"))
    assert a.equals(b)  # a PaperPolicy value runs the same rules as the default


def test_resume_with_another_policy_is_refused(tmp_path):
    cfg = RunConfig(**_settings(tmp_path))
    _run(cfg, tmp_path / "out", LeastVotedPolicyForTests())
    with pytest.raises(ConfigError, match="round policy 'paper'; the run in --out used 'least-voted"):
        _run(cfg, tmp_path / "out", resume=True)


class OneVoteForTests(LeastVotedPolicyForTests):
    """The least-voted experiment, with one vote: after round 0 only."""

    name = "one-vote-for-tests"

    def votes_after(self, t: int, rounds: int) -> bool:
        return t == 0


def test_a_policy_that_votes_less_spends_the_whole_budget_on_fewer_less_noisy_votes(tmp_path):
    cfg = RunConfig(**_settings(tmp_path))  # 3 rounds: the paper votes twice
    policy = OneVoteForTests()
    assert planned_votes(policy, cfg.rounds) == 1 and planned_votes(PaperPolicy(), cfg.rounds) == 2
    swapped = dataclasses.replace(prepare(cfg), policy=policy)  # a plan made for the paper's 2 votes
    with pytest.raises(ConfigError, match="votes 1 times in 3 rounds, but the privacy plan is for 2"):
        Run(swapped, tmp_path / "refused", engine_factory=None, embedder=None)
    assert not (tmp_path / "refused").exists()
    ctx = prepare(cfg, policy=policy)
    # The exact accountant composes k equal Gaussian votes as one of sigma / sqrt(k).
    assert ctx.plan.sigma == pytest.approx(prepare(cfg).plan.sigma / np.sqrt(2), rel=1e-6)
    # The dry run's plan counts the same one vote at the same sigma.
    (votes,) = plan_run(cfg, policy).releases
    assert votes.count == 1 and votes.sigma == pytest.approx(ctx.plan.sigma)
    out = tmp_path / "out"
    manifest = Run(ctx, out, engine_factory=lambda name, c: FakeEngineForUnitTests(name),
                   embedder=HashEmbedderForTests()).execute().to_json()  # fmt: skip
    ledger = manifest["privacy"]["ledger"]
    assert ledger["compositions"] == 1 and ledger["epsilon_spent_exact"] == pytest.approx(cfg.privacy.epsilon)
    assert [p.name for p in sorted(out.rglob("votes-*.parquet"))] == ["votes-000.parquet"]
    assert len(policy.seen) == 1
    # Rounds 1 and 2 both showed what the one vote chose: the pools and weights stay.
    assert [r["weights_after"] for r in manifest["rounds"]] == [pytest.approx([0.8, 0.2])] * 3
    h_near, texts, _ = policy.seen[0]
    round0 = pq.read_table(next(out.rglob("round-000.parquet"))).column("label").to_pylist()
    for label, pool in RunStore(out).load_state().pools.good.items():
        rows = [i for i, lab in enumerate(round0) if lab == label]
        assert pool == [texts[i] for i in sorted(rows, key=lambda i: h_near[i])[: cfg.s]]


@pytest.mark.parametrize("removed", ["quality_gate", "final_vote", "prompt_style", "label_check_margin"])
def test_a_run_file_that_sets_a_removed_lever_is_told_where_it_went(removed):
    with pytest.raises(ConfigError, match=f"{removed}: measured, not adopted and removed.*f7b6f4b"):
        build_config({removed: 1}, {})
