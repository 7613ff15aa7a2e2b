"""What the round loop keeps of the quality levers: the label check, the private label prior, the far
votes, the paper's PLM weights and the label agreement diagnostic (the rejected levers left the
product: docs/research/levers-not-adopted.md).

Generation comes from engines named ``...ForUnitTests`` and embeddings from ``HashEmbedderForTests``:
the subject is the loop's handling, not an LLM (real engines: tests/test_engines_real.py).
"""

from __future__ import annotations

import math
import re
import shutil

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.fakes import FakeEngineForUnitTests, HashEmbedderForTests
from tests.privacy_checks import private_texts
from wasp_vllm.config import RunConfig
from wasp_vllm.evaluation import evaluate_synthetic
from wasp_vllm.evaluation.settings import EvalSettings
from wasp_vllm.pipeline import Run, prepare
from wasp_vllm.pipeline.context import privacy_plan
from wasp_vllm.pipeline.label_check import LabelCheck
from wasp_vllm.pipeline.store import RunStore
from wasp_vllm.privacy.accountant import EXACT
from wasp_vllm.tasks import get_task

LABELS = ["positive", "neutral", "negative"]
JUNK = [
    "🙂🙂🙂 !!!",
    "negative sentiment",
    "<i>Prozac</i>,",
    "Review 2: great drug",
    "good good good good good",
]


class JunkEngineForUnitTests(FakeEngineForUnitTests):
    """Every other answer is junk of the kinds small PLMs write (emoji, echoes, markup, lists, loops)."""

    def generate(self, prompts, seeds, params):
        out = super().generate(prompts, seeds, params)
        for i, seed in enumerate(seeds):
            if seed % 2:
                out[i] = type(out[i])(JUNK[seed % len(JUNK)], 5)
        return out


class WrongLabelEngineForUnitTests(FakeEngineForUnitTests):
    """Writes the sentiment word of the label its prompt asks for, but every other answer the
    word of another label: a PLM that ignores the sentiment it is asked to write."""

    def generate(self, prompts, seeds, params):
        out = super().generate(prompts, seeds, params)
        for i, (prompt, seed) in enumerate(zip(prompts, seeds, strict=True)):
            asked = max(LABELS, key=lambda lab: prompt.rfind(f"{lab} "))  # the instruction comes last
            word = LABELS[(LABELS.index(asked) + 1) % 3] if seed % 2 else asked
            out[i] = type(out[i])(f"{word} {word} {word} review {seed}", 6)
        return out


def write_private(path, n=60, share=(0.7, 0.1, 0.2)):
    counts = [int(round(n * s)) for s in share]
    labels = [lab for lab, c in zip(LABELS, counts, strict=True) for _ in range(c)]
    rows = [f"{t},{lab}" for t, lab in zip(private_texts(len(labels), seed=4), labels, strict=True)]
    path.write_text("text,label\n" + "\n".join(rows) + "\n")
    return path


def run(tmp_path, engine=FakeEngineForUnitTests, **kw):
    private = str(write_private(tmp_path / "p.csv"))
    settings = dict(plms=["a", "b"], task="drugs", private=private, private_limit=None, n=90, rounds=3,
                    q=2, s=2, noise_seed=1, engine_args={"concurrent": False},
                    label_prior="uniform") | kw  # fmt: skip
    cfg = RunConfig(**settings)
    manifest = (
        Run(
            prepare(cfg),
            tmp_path / "out",
            engine_factory=engine if not isinstance(engine, type) else lambda name, c: engine(name),
            embedder=HashEmbedderForTests(),
        )
        .execute()
        .to_json()
    )
    return cfg, manifest, pq.read_table(tmp_path / "out" / "synthetic.parquet")


def test_the_label_check_flags_a_sample_nearer_another_labels_description():
    check = LabelCheck(get_task("drugs"), HashEmbedderForTests())
    texts = ["negative negative negative review", "positive positive positive review"]
    emb = HashEmbedderForTests().encode(texts)
    assert check.off_label(emb, ["positive", "positive"]).tolist() == [True, False]
    assert check.off_label(emb, ["negative", "negative"]).tolist() == [False, True]


def _written_as_labelled(table) -> np.ndarray:
    texts, labels = table.column("text").to_pylist(), table.column("label").to_pylist()
    return np.array([text.split()[0] == label for text, label in zip(texts, labels, strict=True)])


def test_the_label_check_drops_off_label_samples_and_regenerates_them(tmp_path):
    _, manifest, table = run(tmp_path, WrongLabelEngineForUnitTests, label_check="drop")
    assert table.num_rows == 90  # off-label samples regenerated: exactly N
    assert _written_as_labelled(table).all()
    off = sum(r.get("off_label", 0) for rnd in manifest["rounds"] for r in rnd["rejects"].values())
    assert off > 0
    assert manifest["config"]["label_check"] == "drop"
    # the embeddings the check computed are the ones written (the round embeds each sample once)
    emb = np.asarray(table.column("embedding").to_pylist(), dtype=np.float32)
    np.testing.assert_allclose(
        emb, HashEmbedderForTests().encode(table.column("text").to_pylist()), atol=1e-6
    )


def test_without_the_label_check_off_label_samples_get_in(tmp_path):
    _, manifest, table = run(tmp_path, WrongLabelEngineForUnitTests, label_check="off")
    assert manifest["config"]["label_check"] == "off"
    assert not _written_as_labelled(table).all()


def _shown_examples(prompts: list[str]) -> list[tuple[str, str]]:
    """(label asked for, label word of an example) for every example a few-shot prompt shows."""
    out = []
    for prompt in prompts:
        examples, few_shot, instruction = prompt.rpartition("Based on the above")
        if not few_shot:
            continue  # round 0's zero-shot prompts
        asked = next(lab for lab in LABELS if f"also in {get_task('drugs').label_text(lab)}" in instruction)
        out += [(asked, text.split()[0]) for text in re.findall(r'The drug review is: "([^"]*)"', examples)]
    return out


def _far_ranks_of_examples(out) -> list[int]:
    """For each sample of the last good pools, its rank by noisy far vote among its label's samples
    (0: the one the far votes put furthest), from the votes that chose those pools (round 1's)."""
    store = RunStore(out)
    samples = pa.concat_tables([store.read_round(t) for t in range(2)])
    far = pq.read_table(store.votes_path(1)).column("h_far").to_numpy()
    texts, labels = samples.column("text").to_pylist(), samples.column("label").to_pylist()
    state = store.load_state()
    assert state is not None
    ranks = []
    for label, pool in state.pools.good.items():
        rows = [i for i, lab in enumerate(labels) if lab == label]
        order = sorted(rows, key=lambda i: (-far[i], -i))  # the filter's order: ties set aside the higher row
        ranks += [order.index(texts.index(text)) for text in pool]
    return ranks


def test_a_private_label_prior_is_paid_for_and_shapes_the_labels(tmp_path):
    cfg, manifest, table = run(tmp_path, label_prior="private", label_prior_share=0.5, epsilon=50.0)
    shares = manifest["labels"]["shares"]
    assert shares[0] > 0.5 and shares[1] < 0.2  # 70 / 10 / 20 % private labels, little noise at eps 50
    counts = np.bincount([LABELS.index(x) for x in table.column("label").to_pylist()], minlength=3)
    assert counts[0] > counts[2] > counts[1]
    ledger = manifest["privacy"]["ledger"]
    assert ledger["compositions"] == 3  # the label histogram and the two votes
    assert ledger["epsilon_spent_exact"] == pytest.approx(50.0, rel=1e-6)  # one budget, composed exactly
    assert manifest["privacy"]["plan"]["prior_sigma"] > 0
    with pytest.raises(ValueError, match="exact accountant"):
        RunConfig(label_prior="private", accountant="paper")


def _smoothed(raw: np.ndarray, smoothing: float) -> np.ndarray:
    return (1 - smoothing) * raw + smoothing / raw.size


def _floored(raw: np.ndarray, floor_of_even: float) -> np.ndarray:
    shares = np.maximum(raw, floor_of_even / raw.size)
    return shares / shares.sum()


def test_label_agreement_with_a_reference_set(tmp_path):
    run(tmp_path)
    private = str(tmp_path / "p.csv")
    synthetic, scored = (
        tmp_path / "out" / "synthetic.parquet",
        EvalSettings(test=private, task="drugs", reference=private),
    )
    report = evaluate_synthetic(synthetic, scored, embedder=HashEmbedderForTests()).to_json()
    # The reference may hold private records (here it is the private file): the figure, an
    # un-noised statistic of it, is the operator's unless the reference is declared public.
    assert "label_agreement" not in report
    agreement = report["operator_only"]["label_agreement"]
    assert 0.0 <= agreement["overall"] <= 1.0 and agreement["n"] == 90
    assert set(agreement["per_label"]) == set(LABELS) and agreement["reference_public"] is False
    with pytest.raises(ValueError, match="private data of the run"):  # the run's own private file
        evaluate_synthetic(synthetic, scored.model_copy(update={"reference_public": True}))
    shutil.copy(private, tmp_path / "copy.csv")  # the same records under another name: not public
    copied = scored.model_copy(update={"reference_public": True, "reference": str(tmp_path / "copy.csv")})
    with pytest.raises(ValueError, match="shares records with the private data of the run"):
        evaluate_synthetic(synthetic, copied, embedder=HashEmbedderForTests())
    public = tmp_path / "public.csv"  # records no private file holds
    public.write_text(
        "text,label\n" + "".join(f"{t},{LABELS[i % 3]}\n" for i, t in enumerate(private_texts(30, seed=77)))
    )
    declared = scored.model_copy(update={"reference_public": True, "reference": str(public)})
    published = evaluate_synthetic(synthetic, declared, embedder=HashEmbedderForTests()).to_json()
    assert 0.0 <= published["label_agreement"]["overall"] <= 1.0 and "operator_only" not in published
    with pytest.raises(
        ValueError, match="shares records with the private set"
    ):  # declared public, yet private
        with_private = declared.model_copy(update={"private": str(public)})
        evaluate_synthetic(synthetic, with_private, embedder=HashEmbedderForTests())


def test_the_exact_accountant_composes_prior_and_votes(tmp_path):
    private = str(write_private(tmp_path / "p.csv"))
    cfg = RunConfig(private=private, private_limit=None, n=90, q=2, s=2, label_prior="private",
                    label_prior_share=0.2, epsilon=4.0)  # fmt: skip
    ctx = prepare(cfg)
    plan = ctx.plan
    releases = [plan.prior_release(), *(plan.release(t) for t in range(plan.compositions))]
    assert EXACT.epsilon(releases, plan.delta) == pytest.approx(4.0, rel=1e-6)
    mu_prior = plan.prior_sensitivity / plan.prior_sigma
    mu_votes2 = sum((r.sensitivity / r.sigma) ** 2 for r in releases[1:])
    assert mu_prior**2 / (mu_prior**2 + mu_votes2) == pytest.approx(0.2, rel=1e-6)  # the share asked for


@pytest.mark.parametrize(
    ("settings", "prior"),
    [
        ({}, "uniform"),  # the paper's even split (README: the private prior failed the lever rule)
        ({"strategy": "fusegen", "plms": ["a", "b"]}, "uniform"),
        ({"parties": 3}, "uniform"),  # parties' labels are never pooled
        ({"label_prior": "private"}, "private"),  # paid for only where asked
    ],
)
def test_the_label_prior_is_even_unless_a_private_one_is_asked_for(settings, prior):
    cfg = RunConfig(**settings)
    assert cfg.label_prior == prior
    assert RunConfig(**cfg.model_dump()).fingerprint() == cfg.fingerprint()  # resume sees the same


@pytest.mark.parametrize(
    ("settings", "far"),
    [
        ({}, "on"),  # the default: both histograms, as the paper (auto was measured, not adopted)
        ({"far_votes": "auto"}, "off"),  # few-shot WASP shows the good pool only: H_far is not released
        ({"far_votes": "auto", "later_prompt": "contrastive"}, "on"),  # the paper's prompts show it
        ({"far_votes": "auto", "strategy": "aug-pe", "plms": ["a"]}, "off"),
        ({"far_votes": "off"}, "off"),
    ],
)
def test_the_far_votes_are_released_only_where_the_prompts_show_them(settings, far):
    cfg = RunConfig(**settings)
    assert cfg.far_votes == far
    assert RunConfig(**cfg.model_dump()).fingerprint() == cfg.fingerprint()  # resume sees the same
    plan = privacy_plan(cfg)
    assert plan.histograms == (2 if far == "on" else 1)
    both = privacy_plan(RunConfig(**{**settings, "far_votes": "on"}))
    assert plan.sigma == pytest.approx(both.sigma / (1 if far == "on" else math.sqrt(2)), rel=1e-6)


def test_contrastive_prompts_without_far_votes_are_refused():
    with pytest.raises(ValueError, match="far_votes=off: contrastive prompts show the far pool"):
        RunConfig(later_prompt="contrastive", far_votes="off")


def test_the_plm_weights_follow_the_published_votes_by_the_papers_rule(tmp_path):
    """Each round's next weights are the paper's rule applied to that round's published noisy votes."""
    from wasp_vllm.pipeline.selection import plm_weights

    cfg, manifest, _ = run(tmp_path, n=60, rounds=4)
    out = tmp_path / "out"
    samples = pa.concat_tables([pq.read_table(p) for p in sorted(out.rglob("round-*.parquet"))])
    plm_of = dict(zip(samples.column("id").to_pylist(), samples.column("plm").to_pylist(), strict=True))
    voted_rounds = [r for r in manifest["rounds"] if r["round"] < cfg.rounds - 1]
    assert len(voted_rounds) == 3
    for record in voted_rounds:
        votes = pq.read_table(next(out.rglob(f"votes-{record['round']:03d}.parquet")))
        plm = np.array([cfg.plms.index(plm_of[i]) for i in votes.column("id").to_pylist()])
        prev = np.array(record["weights_before"])
        expected = plm_weights(votes.column("h_near").to_numpy(), plm, 2, prev)
        np.testing.assert_allclose(record["weights_after"], expected)
