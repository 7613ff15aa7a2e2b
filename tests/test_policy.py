"""The round-policy seam: a policy handed to ``Run`` decides the pools, the PLM weights and which
samples are kept; it sees the published noisy votes, public samples with their whole slot and the
run's public context only; it is a frozen dataclass, recorded with its settings for ``--resume``;
it may ask for a vote schedule, which the plan decides and the ledger enforces; the paper's policy
is the default and is not named in the manifest; a run file cannot reach a removed lever.

Generation comes from ``FakeEngineForUnitTests`` and embeddings from ``HashEmbedderForTests``: the
subject is the loop's use of the policy, not an LLM.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.fakes import FakeEngineForUnitTests, HashEmbedderForTests
from tests.privacy_checks import private_texts
from wasp_vllm.config import ConfigError, RunConfig, build_config
from wasp_vllm.pipeline import Run, prepare
from wasp_vllm.pipeline.estimate import plan_run
from wasp_vllm.pipeline.policy import ChosenPools, PaperPolicy, PolicyContext, Vote
from wasp_vllm.pipeline.prompts import Slot
from wasp_vllm.pipeline.store import RunStore
from wasp_vllm.privacy.accountant import UnplannedRelease

LABELS = ["positive", "neutral", "negative"]


@dataclass(frozen=True)
class LeastVotedPolicyForTests(PaperPolicy):
    """An experiment as the harness would hand one: the good pool is the *least* voted samples,
    PLM weights are fixed at 0.8 / 0.2, and samples naming 'sleep' are turned down. Records what
    it was shown (a recorder, not a setting: ``compare=False``), so the test can compare it with
    what the run published."""

    name: ClassVar[str] = "least-voted-for-tests"
    weight_a: float = 0.8
    seen: list[Vote] = field(default_factory=list, compare=False)
    slots: list[tuple[str, Slot, PolicyContext]] = field(default_factory=list, compare=False)

    def pools(self, run: PolicyContext, vote: Vote) -> ChosenPools:
        self.seen.append(vote)
        samples, good = vote.samples, {}
        for label in range(samples.n_labels):
            rows = np.flatnonzero(samples.labels == label)
            good[label] = rows[np.argsort(vote.votes.h_near[rows], kind="stable")][: run.s]
        return ChosenPools(good=good, bad={label: rows[:0] for label, rows in good.items()})

    def plm_weights(self, run: PolicyContext, vote: Vote, previous: np.ndarray) -> np.ndarray:
        return np.array([self.weight_a, 1 - self.weight_a])

    def reject(self, run: PolicyContext, text: str, slot: Slot) -> str | None:
        self.slots.append((text, slot, run))
        return "mentions_sleep" if "sleep" in text else None


def _settings(tmp_path) -> dict:
    private = tmp_path / "p.csv"
    rows = [f"{t},{LABELS[i % 3]}" for i, t in enumerate(private_texts(30, seed=5))]
    private.write_text("text,label\n" + "\n".join(rows) + "\n")
    return dict(plms=["a", "b"], task="drugs", private=str(private), private_limit=None, n=60, rounds=3,
                q=2, s=2, noise_seed=1, engine_args={"concurrent": False})  # fmt: skip


def _run(cfg: RunConfig, out, policy=None, **kw):
    extra = {} if policy is None else {"policy": policy}
    return Run(prepare(cfg, **extra), out, engine_factory=lambda name, c: FakeEngineForUnitTests(name),
               embedder=HashEmbedderForTests()).execute(**kw).to_json()  # fmt: skip


def test_a_policy_chooses_pools_weights_and_rejects_from_the_published_votes(tmp_path):
    cfg = RunConfig(**_settings(tmp_path))
    policy = LeastVotedPolicyForTests()
    manifest = _run(cfg, tmp_path / "out", policy)
    assert manifest["policy"] == {"name": policy.name, "settings": {"weight_a": 0.8}}
    # It was shown exactly the noisy votes the run published, over D so far, and the earlier ones.
    assert [v.round for v in policy.seen] == list(range(cfg.rounds - 1))
    out = tmp_path / "out"
    for t, vote in enumerate(policy.seen):
        published = pq.read_table(next(out.rglob(f"votes-{t:03d}.parquet")))
        np.testing.assert_array_equal(vote.votes.h_near, published.column("h_near").to_numpy())
        assert len(vote.samples.texts) == published.num_rows
        written = [pq.read_table(next(out.rglob(f"round-{r:03d}.parquet"))).num_rows for r in range(t + 1)]
        assert vote.samples.rounds.tolist() == [r for r, k in enumerate(written) for _ in range(k)]
        assert len(vote.earlier) == t and all(
            e is v.votes for e, v in zip(vote.earlier, policy.seen, strict=False)
        )
    # Its weights and its rejects reached the loop.
    for record in manifest["rounds"][: cfg.rounds - 1]:
        assert record["weights_after"] == pytest.approx([0.8, 0.2])
    table = pq.read_table(out / "synthetic.parquet")
    assert not any("sleep" in t for t in table.column("text").to_pylist())
    assert any(r["rejects"].get("a", {}).get("mentions_sleep") for r in manifest["rounds"])
    # Its pools (the least voted samples) are what the state keeps for the next round.
    state = RunStore(out).load_state()
    last = policy.seen[-1]
    synth = pa.concat_tables([pq.read_table(p) for p in sorted(out.rglob("round-*.parquet"))[:2]])
    labels = synth.column("label").to_pylist()
    for label, pool in state.pools.good.items():
        rows = [i for i, lab in enumerate(labels) if lab == label]
        least = sorted(rows, key=lambda i: last.votes.h_near[i])[: cfg.s]
        assert pool == [last.samples.texts[i] for i in least]


def test_a_policy_sees_each_samples_whole_slot_and_its_runs_context(tmp_path):
    cfg = RunConfig(**_settings(tmp_path))
    policy = LeastVotedPolicyForTests()
    _run(cfg, tmp_path / "out", policy)
    (text, slot, run), *_ = policy.slots
    assert run.task.name == "drugs" and run.plms == ("a", "b") and run.s == 2 and run.rounds == 3
    assert run.embedder.encode([text]).shape == (1, 64) and run.sigma is not None
    shown = [s for _, s, _ in policy.slots if s.kind != "zero_shot"]
    assert shown and {s.plm for s in shown} == {"a", "b"}
    # The examples each prompt showed are drawn from the pools the policy chose (per label, over
    # both votes), and the slot keeps them apart (good, bad) as plain text.
    votes = list(policy.seen)
    assert len(votes) == cfg.rounds - 1
    chosen: dict[str, set[str]] = {label: set() for label in run.task.labels}
    for vote in votes:
        for c, rows in policy.pools(run, vote).good.items():
            chosen[run.task.labels[c]] |= {vote.samples.texts[i] for i in rows}
    for slot in shown:
        assert slot.good and set(slot.good) <= chosen[slot.label] and slot.bad == ()
        assert slot.examples == slot.good and all(type(e) is str for e in slot.good)


def test_the_papers_policy_is_the_default_and_goes_unnamed(tmp_path):
    cfg = RunConfig(**_settings(tmp_path))
    default = _run(cfg, tmp_path / "default")
    paper = _run(cfg, tmp_path / "paper", PaperPolicy())
    assert "policy" not in default and "policy" not in paper
    a, b = (pq.read_table(tmp_path / d / "synthetic.parquet") for d in ("default", "paper"))
    assert a.equals(b)  # a PaperPolicy value runs the same rules as the default


def test_resume_with_another_policy_or_other_settings_is_refused(tmp_path):
    cfg = RunConfig(**_settings(tmp_path))
    _run(cfg, tmp_path / "out", LeastVotedPolicyForTests())
    with pytest.raises(ConfigError, match="round policy .*'paper'.*the run in --out used .*least-voted"):
        _run(cfg, tmp_path / "out", resume=True)
    with pytest.raises(ConfigError, match="'weight_a': 0.5.*the run in --out used .*'weight_a': 0.8"):
        _run(cfg, tmp_path / "out", LeastVotedPolicyForTests(weight_a=0.5), resume=True)
    _run(cfg, tmp_path / "out", LeastVotedPolicyForTests(), resume=True)  # the same settings resume


class StatefulPolicyForTests(PaperPolicy):
    """Not a frozen dataclass: it could carry state between rounds that a resume would lose."""

    name = "stateful-for-tests"


def test_a_policy_that_could_keep_state_is_refused_before_anything_is_read(tmp_path):
    cfg = RunConfig(**_settings(tmp_path))
    with pytest.raises(ConfigError, match="must be a frozen dataclass"):
        prepare(cfg, policy=StatefulPolicyForTests())
    with pytest.raises(ConfigError, match="must be a frozen dataclass"):
        Run(dataclasses.replace(prepare(cfg), policy=StatefulPolicyForTests()), tmp_path / "x",
            engine_factory=None, embedder=None)  # fmt: skip
    assert not (tmp_path / "x").exists()


@dataclass(frozen=True)
class OneVoteForTests(LeastVotedPolicyForTests):
    """The least-voted experiment, asking for one vote: after round 0 only."""

    name: ClassVar[str] = "one-vote-for-tests"

    def vote_request(self, rounds: int) -> tuple[int, ...] | None:
        return (0,)


@dataclass(frozen=True)
class ImpossibleVotesForTests(LeastVotedPolicyForTests):
    name: ClassVar[str] = "impossible-votes-for-tests"

    def vote_request(self, rounds: int) -> tuple[int, ...] | None:
        return (rounds - 1,)  # after the last round: never voted on


def test_a_policy_asks_for_fewer_votes_the_plan_decides_and_the_ledger_enforces(tmp_path):
    cfg = RunConfig(**_settings(tmp_path))  # 3 rounds: the paper votes twice
    with pytest.raises(ConfigError, match="impossible-votes-for-tests' asks for votes after rounds \\[2\\]"):
        prepare(cfg, policy=ImpossibleVotesForTests())
    policy = OneVoteForTests()
    ctx = prepare(cfg, policy=policy)
    assert ctx.plan.vote_rounds == (0,) and prepare(cfg).plan.vote_rounds == (0, 1)
    # The exact accountant composes k equal Gaussian votes as one of sigma / sqrt(k).
    assert ctx.plan.sigma == pytest.approx(prepare(cfg).plan.sigma / np.sqrt(2), rel=1e-6)
    # The dry run's plan counts the same one vote at the same sigma.
    (votes,) = plan_run(cfg, ctx.plan).releases
    assert votes.count == 1 and votes.sigma == pytest.approx(ctx.plan.sigma)
    # The ledger refuses what the plan did not make: a second vote, or the same vote twice.
    ledger = ctx.plan.open_ledger()
    with pytest.raises(UnplannedRelease, match="after round 1 .* not in the run's privacy plan"):
        ledger.record(ctx.plan.release(1))
    ledger.record(ctx.plan.release(0))
    with pytest.raises(UnplannedRelease, match="already recorded"):
        ledger.record(ctx.plan.release(0))
    out = tmp_path / "out"
    manifest = Run(ctx, out, engine_factory=lambda name, c: FakeEngineForUnitTests(name),
                   embedder=HashEmbedderForTests()).execute().to_json()  # fmt: skip
    ledger_json = manifest["privacy"]["ledger"]
    assert ledger_json["compositions"] == 1
    assert ledger_json["epsilon_spent_exact"] == pytest.approx(cfg.privacy.epsilon)
    assert manifest["privacy"]["plan"]["vote_rounds"] == [0]
    assert [p.name for p in sorted(out.rglob("votes-*.parquet"))] == ["votes-000.parquet"]
    assert len(policy.seen) == 1
    # Rounds 1 and 2 both showed what the one vote chose: the pools and weights stay.
    assert [r["weights_after"] for r in manifest["rounds"]] == [pytest.approx([0.8, 0.2])] * 3
    vote = policy.seen[0]
    round0 = pq.read_table(next(out.rglob("round-000.parquet"))).column("label").to_pylist()
    for label, pool in RunStore(out).load_state().pools.good.items():
        rows = [i for i, lab in enumerate(round0) if lab == label]
        assert pool == [
            vote.samples.texts[i] for i in sorted(rows, key=lambda i: vote.votes.h_near[i])[: cfg.s]
        ]


def test_a_swapped_policy_votes_by_the_plan_not_by_its_own_request(tmp_path):
    """The plan owns the schedule: a context whose policy was replaced after ``prepare`` votes as
    its plan says (and pays for), whatever the new policy would have asked."""
    cfg = RunConfig(**_settings(tmp_path))
    swapped = dataclasses.replace(prepare(cfg), policy=OneVoteForTests())  # a plan for the paper's 2 votes
    manifest = Run(swapped, tmp_path / "out", engine_factory=lambda name, c: FakeEngineForUnitTests(name),
                   embedder=HashEmbedderForTests()).execute().to_json()  # fmt: skip
    assert manifest["privacy"]["ledger"]["compositions"] == 2
    assert len(list((tmp_path / "out").rglob("votes-*.parquet"))) == 2


@pytest.mark.parametrize("removed", ["quality_gate", "final_vote", "prompt_style", "label_check_margin"])
def test_a_run_file_that_sets_a_removed_lever_is_told_where_it_went(removed):
    with pytest.raises(ConfigError, match=f"{removed}: measured, not adopted and removed.*f7b6f4b"):
        build_config({removed: 1}, {})


def test_the_python_api_publishes_the_plan_of_the_policy_it_ran(tmp_path):
    """``wasp_vllm.generate`` with a policy that asks for one vote: the estimate published beside the
    manifest counts the one vote at the run's own sigma (calibrated once), not the paper's two."""
    import wasp_vllm
    from wasp_vllm.api import run_config
    from wasp_vllm.pipeline import Backends, Collaborators

    settings = _settings(tmp_path)
    engines = Backends(lambda name, c: FakeEngineForUnitTests(name), HashEmbedderForTests())
    result = wasp_vllm.generate(out=tmp_path / "out", collaborators=Collaborators(engines, OneVoteForTests()),
                                **settings)  # fmt: skip
    (votes,) = result.manifest.estimate["plan"]["releases"]
    assert votes["count"] == 1 == result.privacy.compositions
    assert votes["sigma"] == result.privacy.plan.sigma == result.privacy.sigma
    (paper,) = plan_run(run_config(None, None, settings)).releases  # the same settings, the paper's votes
    assert paper.count == 2 and votes["sigma"] == pytest.approx(paper.sigma / np.sqrt(2), rel=1e-6)
