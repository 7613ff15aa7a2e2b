"""The quality levers of issue 15 in the round loop: the gate, the label check, the private label
prior, the final vote and its weights, the short prompts, and the label agreement diagnostic.

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
                    q=2, s=2, noise_seed=1, concurrent=False, label_prior="uniform") | kw  # fmt: skip
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


def test_the_gate_keeps_junk_out_and_counts_it_per_plm_and_reason(tmp_path):
    _, manifest, table = run(tmp_path, JunkEngineForUnitTests, quality_gate=True)
    assert table.num_rows == 90  # rejects regenerated: exactly N
    texts = table.column("text").to_pylist()
    assert not set(JUNK) & set(texts) and not any("<i>" in t or "🙂" in t for t in texts)
    rejects = manifest["rounds"][0]["rejects"]
    assert set(rejects) == {"a", "b"}
    reasons = set().union(*(set(r) for r in rejects.values()))
    # "<i>Prozac</i>," is cleaned of its tags, then refused as a list fragment (its trailing comma)
    assert {"non_language", "echo", "list_fragment", "repetition"} <= reasons


def test_without_the_gate_junk_gets_in(tmp_path):
    _, _, table = run(tmp_path, JunkEngineForUnitTests, quality_gate=False)
    assert set(JUNK) & set(table.column("text").to_pylist())


def test_the_label_check_flags_a_sample_nearer_another_labels_description():
    check = LabelCheck(get_task("drugs"), HashEmbedderForTests())
    texts = ["negative negative negative review", "positive positive positive review"]
    emb = HashEmbedderForTests().encode(texts)
    assert check.off_label(emb, ["positive", "positive"]).tolist() == [True, False]
    assert check.off_label(emb, ["negative", "negative"]).tolist() == [False, True]
    # a margin as wide as the cosine range keeps everything
    assert (
        not LabelCheck(get_task("drugs"), HashEmbedderForTests(), margin=2.0)
        .off_label(emb, ["positive"] * 2)
        .any()
    )
    with pytest.raises(ValueError, match="margin"):
        LabelCheck(get_task("drugs"), HashEmbedderForTests(), margin=-0.1)


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


def test_the_pool_label_filter_shows_examples_that_read_as_their_label(tmp_path):
    """Half of what the PLMs write carries another label's word (label check off): the votes alone
    put such samples in the prompts; with --pool-label-filter 0.5 the good pool takes only the half
    of each label's samples that read most like it, so the prompts show on-label examples."""
    shown = {}
    for share in (0.0, 0.5):
        engines: dict[str, WrongLabelEngineForUnitTests] = {}

        def factory(name, cfg, engines=engines):
            return engines.setdefault(name, WrongLabelEngineForUnitTests(name))

        (tmp_path / str(share)).mkdir()
        run(tmp_path / str(share), factory, label_check="off", pool_label_filter=share)
        shown[share] = _shown_examples([p for e in engines.values() for p in e.prompts])
    for share, pairs in shown.items():
        assert len(pairs) > 20, share
    on_label = {share: np.mean([a == w for a, w in pairs]) for share, pairs in shown.items()}
    assert on_label[0.0] < 0.9 and on_label[0.5] == 1.0, on_label


def test_the_pool_label_filter_needs_prompts_that_show_examples():
    with pytest.raises(ValueError, match="pool_label_filter: only for methods whose prompts"):
        RunConfig(strategy="fusegen", pool_label_filter=0.5)
    with pytest.raises(ValueError, match="less than or equal to 0.9"):
        RunConfig(pool_label_filter=0.95)


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


def test_the_pool_far_filter_keeps_the_samples_the_far_votes_flag_out_of_the_prompts(tmp_path):
    """Without the filter the near votes (mostly noise at eps 4) put samples that the far votes rank
    in each label's furthest half into the good pools; --pool-far-filter 0.5 sets that half aside."""
    for share in (0.0, 0.5):
        (tmp_path / str(share)).mkdir()
        run(tmp_path / str(share), label_check="off", s=6, pool_far_filter=share)
        ranks = _far_ranks_of_examples(tmp_path / str(share) / "out")
        assert len(ranks) >= 12, ranks  # pools of up to 6 from 20 samples per label
        flagged = sum(rank < 10 for rank in ranks)  # 20 samples of a label: half set aside
        assert flagged == 0 if share else flagged > 0, (share, ranks)
    with pytest.raises(ValueError, match="pool_far_filter: filters the examples by the far votes"):
        RunConfig(pool_far_filter=0.5, far_votes="off")
    with pytest.raises(ValueError, match="pool_far_filter: only for methods whose prompts"):
        RunConfig(pool_far_filter=0.5, later_prompt="zero_shot")
    assert RunConfig(pool_far_filter=0.5, far_votes="auto").far_votes == "on"  # the filter uses them
    assert RunConfig(far_votes="auto").far_votes == "off"  # few-shot prompts alone do not


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


@pytest.mark.parametrize(
    ("lever", "expected"),
    [
        ({"label_prior_smoothing": 0.5}, lambda raw: _smoothed(raw, 0.5)),
        ({"label_prior_smoothing": 1.0}, lambda raw: np.full(3, 1 / 3)),
        ({"label_prior_floor": 0.9}, lambda raw: _floored(raw, 0.9)),  # the 10 % label to 30 %
    ],
)
def test_smoothing_and_floor_move_the_label_prior_towards_an_even_split(tmp_path, lever, expected):
    settings = {"label_prior": "private", "label_prior_share": 0.5, "epsilon": 50.0}
    (tmp_path / "raw").mkdir(), (tmp_path / "moved").mkdir()
    _, raw, _ = run(tmp_path / "raw", **settings)
    _, moved, _ = run(tmp_path / "moved", **settings, **lever)
    raw_shares, shares = np.asarray(raw["labels"]["shares"]), np.asarray(moved["labels"]["shares"])
    # Post-processing of the same noisy histogram: the same noise key draws the same counts.
    assert shares == pytest.approx(expected(raw_shares), abs=1e-9)
    assert np.ptp(shares) < np.ptp(raw_shares)
    spent = [m["privacy"]["ledger"]["epsilon_spent_exact"] for m in (raw, moved)]
    assert spent[0] == spent[1]  # no privacy cost


def test_the_final_vote_writes_weights_that_evaluate_uses(tmp_path):
    cfg, manifest, table = run(tmp_path, final_vote=True)
    assert manifest["privacy"]["ledger"]["compositions"] == cfg.rounds  # T votes, not T-1
    weights = np.asarray(table.column("weight").to_pylist())
    assert weights.min() >= 0.5 and weights.max() <= 1.5 and abs(weights.mean() - 1) < 0.05
    scored = EvalSettings(test=str(tmp_path / "p.csv"), task="drugs")
    report = evaluate_synthetic(
        tmp_path / "out" / "synthetic.parquet", scored, embedder=HashEmbedderForTests()
    )
    assert report.trained_on_weights


def test_short_prompts_come_from_the_task_file(tmp_path):
    engines: dict = {}

    class Recording(FakeEngineForUnitTests):
        def __init__(self, name):
            super().__init__(name)
            engines[name] = self

    run(tmp_path, Recording, prompt_style="short")
    prompts = [p for e in engines.values() for p in e.prompts]
    assert prompts and all("rated" in p for p in prompts)  # drugs' short templates


def test_label_agreement_with_a_reference_set(tmp_path):
    run(tmp_path)
    private = str(tmp_path / "p.csv")
    synthetic, scored = tmp_path / "out" / "synthetic.parquet", EvalSettings(test=private, reference=private)
    report = evaluate_synthetic(synthetic, scored, embedder=HashEmbedderForTests()).to_json()
    # The reference may hold private records (here it is the private file): the figure, an
    # un-noised statistic of it, is the operator's unless the reference is declared public.
    assert "label_agreement" not in report
    agreement = report["operator_only"]["label_agreement"]
    assert 0.0 <= agreement["overall"] <= 1.0 and agreement["n"] == 90
    assert set(agreement["per_label"]) == set(LABELS) and agreement["reference_public"] is False
    with pytest.raises(ValueError, match="private data of the run"):  # the run's own private file
        evaluate_synthetic(synthetic, scored.model_copy(update={"reference_public": True}))
    shutil.copy(private, tmp_path / "public.csv")  # the same records under another name: the user's word
    declared = scored.model_copy(update={"reference_public": True, "reference": str(tmp_path / "public.csv")})
    public = evaluate_synthetic(synthetic, declared, embedder=HashEmbedderForTests()).to_json()
    assert public["label_agreement"]["overall"] == agreement["overall"] and "operator_only" not in public
    with pytest.raises(ValueError, match="overlaps the private set"):  # declared public, yet private
        with_private = declared.model_copy(update={"private": str(tmp_path / "public.csv")})
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


@pytest.mark.parametrize("weighting", ["votes", "shrunk"])
def test_the_plm_weights_follow_the_published_votes_by_the_chosen_rule(tmp_path, weighting):
    """Each round's next weights are the chosen rule applied to that round's published noisy votes
    (and the public sigma): 'shrunk' reaches the loop, and 'votes' stays the paper's rule."""
    import pyarrow as pa

    from wasp_vllm.pipeline.selection import plm_weights, shrunk_plm_weights

    (tmp_path / weighting).mkdir()
    cfg, manifest, _ = run(tmp_path / weighting, plm_weighting=weighting, n=60, rounds=4)
    out = tmp_path / weighting / "out"
    samples = pa.concat_tables([pq.read_table(p) for p in sorted(out.rglob("round-*.parquet"))])
    plm_of = dict(zip(samples.column("id").to_pylist(), samples.column("plm").to_pylist(), strict=True))
    sigma = manifest["privacy"]["plan"]["sigma"]
    voted_rounds = [r for r in manifest["rounds"] if r["round"] < cfg.rounds - 1]
    assert len(voted_rounds) == 3
    for record in voted_rounds:
        votes = pq.read_table(next(out.rglob(f"votes-{record['round']:03d}.parquet")))
        plm = np.array([cfg.plms.index(plm_of[i]) for i in votes.column("id").to_pylist()])
        h = votes.column("h_near").to_numpy()
        prev = np.array(record["weights_before"])
        paper = plm_weights(h, plm, 2, prev)
        shrunk = shrunk_plm_weights(h, plm, 2, prev, sigma)
        np.testing.assert_allclose(record["weights_after"], shrunk if weighting == "shrunk" else paper)


def test_shrunk_plm_weights_need_a_method_that_weighs_its_plms():
    with pytest.raises(ValueError, match="plm_weighting=shrunk: only for methods whose PLM shares"):
        RunConfig(strategy="fusegen", plm_weighting="shrunk")
