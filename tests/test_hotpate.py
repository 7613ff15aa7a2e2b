"""Hot PATE: coordinated ensembles, private aggregation, the privacy ledger and KV-cache reuse."""

from __future__ import annotations

import hashlib
import json
import logging
import math
import types
from collections.abc import Sequence

import numpy as np
import pytest
from scipy.stats import chisquare, norm

from wasp_vllm.hotpate import (
    HeterogeneousAggregator,
    HomogeneousAggregator,
    PrivateTokenSelector,
    VoteHistogram,
    build_teacher_prompts,
    coordinated_votes,
    independent_votes,
    noise_margin,
    run_hotpate,
    vote_histogram,
)

CANARY = "zq-CANARY-7f3e9-secret"


# --------------------------------------------------------------------------------------------
# a stub model: each row's distribution is a fixed function of its prompt
# --------------------------------------------------------------------------------------------


class StubSource:
    """A tiny "LM" over ``vocab`` tokens; token 0 is end-of-sequence.

    Rows whose prompts differ get different (but overlapping) distributions, so the ensemble
    is realistic enough to exercise aggregation; the end token becomes likely after a few
    steps so records finish.
    """

    def __init__(self, prompts: Sequence[str], vocab: int = 16) -> None:
        self.n_rows = len(prompts)
        self.vocab_size = vocab
        self.stop_token_ids = frozenset({0})
        base = np.ones(vocab)
        base[1:4] = 30.0  # three popular tokens every row likes
        rows = []
        for p in prompts:
            seed = int.from_bytes(hashlib.sha256(p.encode()).digest()[:4], "big")
            rows.append(base + np.random.default_rng(seed).uniform(0, 5, vocab))
        self._base = np.array(rows)
        self.generated: list[int] = []

    def next_distributions(self) -> np.ndarray:
        w = self._base.copy()
        w[:, 0] = 0.5 * 4.0 ** len(self.generated)  # end-of-sequence grows with length
        return w / w.sum(axis=1, keepdims=True)

    def append(self, token_id: int) -> None:
        self.generated.append(int(token_id))

    def reset(self) -> None:
        self.generated = []

    def decode(self, token_ids: Sequence[int]) -> str:
        return " ".join(f"w{t}" for t in token_ids)

    def encode(self, text: str) -> list[int]:
        return [5] if text else []  # any public prefix is one token


def _private_set(n_per_label: int = 40) -> tuple[list[str], list[str]]:
    texts, labels = [], []
    for lab in ("good", "bad"):
        for i in range(n_per_label):
            texts.append(f"{lab} review number {i}: {CANARY} patient id {1000 + i}")
            labels.append(lab)
    return texts, labels


# --------------------------------------------------------------------------------------------
# ensembles
# --------------------------------------------------------------------------------------------


def test_coordinated_sampling_is_marginally_each_teachers_distribution():
    rng = np.random.default_rng(0)
    probs = np.array(
        [
            [0.5, 0.2, 0.15, 0.1, 0.05, 0.0],
            [0.05, 0.05, 0.1, 0.2, 0.3, 0.3],
            [1 / 6] * 6,
        ]
    )
    draws = 6000
    votes = np.stack([coordinated_votes(probs, rng) for _ in range(draws)])  # [draws, teachers]
    for i, p in enumerate(probs):
        counts = np.bincount(votes[:, i], minlength=p.size)
        support = p > 0
        assert counts[~support].sum() == 0, "a teacher voted for a token it gives probability 0"
        assert chisquare(counts[support], draws * p[support]).pvalue > 1e-3


def test_coordinated_votes_coincide_for_identical_teachers_independent_spread():
    rng = np.random.default_rng(1)
    probs = np.tile(np.full(5, 0.2), (40, 1))
    coordinated = [np.unique(coordinated_votes(probs, rng)).size for _ in range(50)]
    independent = [np.unique(independent_votes(probs, rng)).size for _ in range(50)]
    assert set(coordinated) == {1}  # every draw: all 40 teachers agree ...
    tops = {int(coordinated_votes(probs, rng)[0]) for _ in range(200)}
    assert tops == set(range(5))  # ... on a token that changes with the shared randomness
    assert min(independent) >= 3  # independent samples spread over the 5 tokens


def test_the_coordinated_draw_on_a_tensor_gives_the_hosts_votes():
    """A GPU source's rows are drawn where they are; the votes must be the host path's, draw by
    draw, from the same shared randomness (run here on CPU tensors: the same code path)."""
    torch = pytest.importorskip("torch")
    from wasp_vllm.hotpate.ensembles import (
        DeviceCoordinatedEnsemble,
        PreparedEnsemble,
        on_host,
        prepare_ensemble,
    )

    probs = np.random.default_rng(3).dirichlet(np.full(300, 0.05), size=64).astype(np.float32)
    probs[:, :40] = 0.0  # ruled-out tokens: never voted for, on either side
    probs /= probs.sum(axis=1, keepdims=True)
    device, host = (
        prepare_ensemble(torch.from_numpy(probs), "coordinated"),
        PreparedEnsemble(probs, "coordinated"),
    )
    assert isinstance(device, DeviceCoordinatedEnsemble)
    rng_device, rng_host = np.random.default_rng(9), np.random.default_rng(9)
    for _ in range(25):
        votes = device.votes(rng_device)
        assert votes.dtype == np.int64 and votes.min() >= 40
        assert np.array_equal(votes, host.votes(rng_host))
    drawn, expected = device.histogram(rng_device), host.histogram(rng_host)
    assert np.array_equal(drawn.tokens, expected.tokens) and np.array_equal(drawn.counts, expected.counts)
    # independent draws (and plain arrays) stay on the host
    assert isinstance(prepare_ensemble(torch.from_numpy(probs), "independent"), PreparedEnsemble)
    assert np.array_equal(on_host(torch.from_numpy(probs)), probs)


def test_independent_votes_are_marginally_right_and_skip_zero_probability():
    rng = np.random.default_rng(2)
    p = np.array([0.0, 0.3, 0.0, 0.7])
    votes = np.concatenate([independent_votes(np.tile(p, (50, 1)), rng) for _ in range(100)])
    counts = np.bincount(votes, minlength=4)
    assert counts[0] == counts[2] == 0
    assert chisquare(counts[[1, 3]], votes.size * p[[1, 3]]).pvalue > 1e-3


@pytest.mark.parametrize("kind", ["coordinated", "independent"])
def test_one_teacher_moves_at_most_one_vote(kind):
    """Sensitivity: changing one teacher's distribution moves one vote between two bins."""
    rng = np.random.default_rng(3)
    for trial in range(200):
        probs = rng.dirichlet(np.full(30, 0.3), size=25)
        changed = probs.copy()
        changed[trial % 25] = rng.dirichlet(np.full(30, 0.3))
        a = vote_histogram(probs, kind, np.random.default_rng(trial)).dense()
        b = vote_histogram(changed, kind, np.random.default_rng(trial)).dense()
        diff = a - b
        assert np.abs(diff).sum() <= 2 and np.abs(diff).max() <= 1
        assert np.linalg.norm(diff) <= math.sqrt(2) + 1e-12


def test_vote_histogram_is_sparse_and_complete():
    hist = VoteHistogram.from_votes(np.array([7, 3, 7, 7, 1]), vocab_size=10)
    assert hist.tokens.tolist() == [1, 3, 7] and hist.counts.tolist() == [1, 1, 3]
    assert hist.n_teachers == 5 and hist.dense().sum() == 5
    assert hist.count(7) == 3 and hist.count(4) == 0
    with pytest.raises(ValueError):
        VoteHistogram.from_votes(np.array([10]), vocab_size=10)


# --------------------------------------------------------------------------------------------
# aggregators
# --------------------------------------------------------------------------------------------


def test_noise_margin_is_the_union_bound_quantile():
    assert noise_margin(2.0, 1000, 1e-3) == pytest.approx(2.0 * norm.isf(1e-6))
    assert noise_margin(0.0, 1000) == 0.0


def test_homogeneous_thresholds_without_noise():
    hist = VoteHistogram.from_votes(np.array([4] * 6 + [2] * 4), vocab_size=8)  # n = 10
    rng = np.random.default_rng(0)
    agg = HomogeneousAggregator(sigma=0.0)  # default threshold n/2 + L = 5
    assert agg(hist, rng).token == 4
    assert HomogeneousAggregator(0.0, threshold=6).resolve_threshold(10, 8) == 6
    assert HomogeneousAggregator(0.0, threshold=6)(hist, rng).token == 4
    assert HomogeneousAggregator(0.0, threshold=6.5)(hist, rng).token is None
    split = VoteHistogram.from_votes(np.array([4] * 5 + [2] * 5), vocab_size=8)
    assert HomogeneousAggregator(0.0, threshold=5.5)(split, rng).token is None


def test_homogeneous_default_threshold_includes_the_noise_margin():
    agg = HomogeneousAggregator(sigma=3.0, beta=1e-3)
    assert agg.resolve_threshold(64, 49152) == pytest.approx(32 + 3.0 * norm.isf(1e-3 / 49152))


def test_heterogeneous_weighted_sampling_and_abstention():
    votes = np.array([1] * 6 + [2] * 3 + [3] * 1)  # n = 10
    hist = VoteHistogram.from_votes(votes, vocab_size=5)
    rng = np.random.default_rng(4)
    agg = HeterogeneousAggregator(sigma=0.0, threshold=2.5)  # token 3 (one vote) never qualifies
    out = [agg(hist, rng).token for _ in range(4000)]
    share = {t: out.count(t) / len(out) for t in (1, 2, 3, None)}
    assert share[3] == 0
    assert share[1] == pytest.approx(0.6, abs=0.03) and share[2] == pytest.approx(0.3, abs=0.03)
    assert share[None] == pytest.approx(0.1, abs=0.02)  # the mass below the threshold abstains
    renorm = HeterogeneousAggregator(sigma=0.0, threshold=2.5, renormalize=True)
    out = [renorm(hist, rng).token for _ in range(2000)]
    assert None not in out and out.count(1) / len(out) == pytest.approx(6 / 9, abs=0.04)


@pytest.mark.parametrize("cls", [HomogeneousAggregator, HeterogeneousAggregator])
def test_noisy_aggregators_never_return_tokens_nobody_voted_for(cls):
    rng = np.random.default_rng(5)
    hist = VoteHistogram.from_votes(np.array([3] * 60 + [9] * 4), vocab_size=2000)
    agg = cls(sigma=4.0)
    tokens = {agg(hist, rng).token for _ in range(300)}
    assert tokens <= {3, None} and 3 in tokens


# --------------------------------------------------------------------------------------------
# token selection, ledger, teachers from private data
# --------------------------------------------------------------------------------------------


def test_selector_retries_then_falls_back_to_the_public_distribution():
    probs = np.eye(8)  # every teacher votes for a different token: no count ever exceeds 1
    public = np.zeros(8)
    public[2] = 1.0
    agg = HomogeneousAggregator(sigma=0.0, threshold=2)
    sel = PrivateTokenSelector(agg, max_retries=2, rng=np.random.default_rng(0))
    decision = sel.select(probs, public, [])
    assert (decision.token, decision.source, decision.releases) == (2, "abstain", 3)
    seen = []
    sel.fallback = lambda p, so_far, rng: seen.append(len(so_far)) or 1
    assert sel.select(probs, public, [5, 6]).token == 1 and seen == [2]


def test_selector_spends_nothing_when_the_threshold_is_out_of_reach():
    from wasp_vllm.privacy.accountant import PrivacyLedger

    ledger = PrivacyLedger(epsilon=8.0, delta=1e-5)
    probs = np.full((8, 4), 0.25)
    agg = HomogeneousAggregator(sigma=1.0, threshold=8 + 7.0)  # 7 sigma above unanimity
    sel = PrivateTokenSelector(agg, ledger=ledger, rng=np.random.default_rng(0))
    decision = sel.select(probs, np.array([0.0, 1.0, 0.0, 0.0]), [])
    assert (decision.token, decision.source, decision.releases) == (1, "no_release", 0)
    assert ledger.releases == [] and sel.releases == 0
    assert not PrivateTokenSelector(HomogeneousAggregator(1.0, threshold=8 + 3.0)).unreachable(8, 4)


def test_teacher_prompts_partition_the_private_records():
    texts = [f"record {i} {CANARY}" for i in range(50)]
    prompts = build_teacher_prompts(texts, teachers=10, label="good", seed=7, examples_per_teacher=50)
    assert len(prompts) == 11  # ten teachers and the public prompt, last
    assert CANARY not in prompts[-1]
    for t in texts:
        assert sum(f" {t}\n" in p + "\n" for p in prompts) == 1  # each record in exactly one teacher
    # adding one record changes exactly one teacher: sensitivity sqrt(2) under add/remove
    more = build_teacher_prompts([*texts, "new"], teachers=10, label="good", seed=7, examples_per_teacher=50)
    assert sum(a != b for a, b in zip(prompts, more, strict=True)) == 1


def test_generate_record_stops_at_a_stop_string_after_a_public_prefix():
    from wasp_vllm.hotpate import generate_record

    source = StubSource(["a prompt", "another", "public"])
    sel = PrivateTokenSelector(HomogeneousAggregator(0.0, threshold=1), rng=np.random.default_rng(0))
    out = generate_record(source, sel, max_tokens=30, prefix_ids=[7, 7], stop=("w2",))
    assert source.generated[:2] == [7, 7]  # the prefix went to every row first
    assert out.end == "stop" and out.tokens[-1] == 2  # seeded: token 2 comes up early
    assert out.text.strip() == " ".join(f"w{t}" for t in out.tokens[:-1])  # cut before the stop
    assert out.releases == out.private + out.fallback


class TensorRows:
    """A source whose rows come back as CPU tensors, as a GPU teacher source's stay on its device."""

    def __init__(self, source: StubSource) -> None:
        self.source = source
        self.n_rows, self.vocab_size, self.stop_token_ids = (
            source.n_rows,
            source.vocab_size,
            source.stop_token_ids,
        )

    def next_distributions(self):
        import torch

        return torch.from_numpy(self.source.next_distributions().astype(np.float32))

    def __getattr__(self, name: str):
        return getattr(self.source, name)


def test_a_record_from_tensor_rows_is_the_record_from_array_rows():
    """The same seeds give the same tokens, sources and releases whether the teachers' rows stay on
    a device (tensor) or come to the host (array), the public row on its own or not."""
    pytest.importorskip("torch")
    from wasp_vllm.hotpate import generate_record
    from wasp_vllm.hotpate.teachers import WithPublicRow

    teachers = [f"teacher prompt {i}" for i in range(30)]

    def record(on_device: bool, public_alone: bool) -> list[tuple]:
        def wrap(prompts: list[str]):
            stub = StubSource(prompts)
            return TensorRows(stub) if on_device else stub

        source = (
            WithPublicRow(wrap(teachers), wrap(["public"])) if public_alone else wrap([*teachers, "public"])
        )
        sel = PrivateTokenSelector(
            HomogeneousAggregator(2.0, threshold=12),
            rng=np.random.default_rng(4),
            noise_rng=np.random.default_rng(5),
        )
        outs = [generate_record(source, sel, max_tokens=12) for _ in range(4)]
        return [(o.tokens, o.sources, o.releases, o.end) for o in outs]

    stacked = WithPublicRow(TensorRows(StubSource(teachers)), TensorRows(StubSource(["public"])))
    expected = WithPublicRow(StubSource(teachers), StubSource(["public"])).next_distributions()
    assert np.array_equal(
        stacked.next_distributions().numpy(), expected.astype(np.float32)
    )  # public row last
    for public_alone in (False, True):
        on_host_rows = record(False, public_alone)
        assert on_host_rows == record(True, public_alone)
        assert sum(o[1]["private"] for o in on_host_rows) > 0  # private calls did happen


def test_run_hotpate_table_and_report():
    texts, labels = _private_set()
    table, report = run_hotpate(
        texts, labels, ["good", "bad"], teachers=16, max_tokens=6, n_samples=6,
        epsilon=50.0, delta=1e-5, seed=1, aggregator="heterogeneous", threshold_fraction=0.9,
        source_factory=lambda prompts: StubSource(prompts),
    )  # fmt: skip
    assert table.column_names == ["id", "text", "label", "attribute", "plm", "round", "prompt_kind"]
    assert set(table.column("prompt_kind").to_pylist()) <= {"hotpate"}
    assert not report.budget_exhausted and report.accounting == "gaussian"
    assert report.records_written == 6
    good = report.labels["good"]
    assert good["sigma"] > 0 and good["sensitivity"] == pytest.approx(math.sqrt(2))
    assert report.tokens_private + report.tokens_fallback > 0
    assert (
        report.epsilon_guaranteed <= 50.0
        and "DP with respect to the private file" in report.guarantee["statement"]
    )


def test_canary_never_leaves_through_logs_report_or_errors(caplog):
    texts, labels = _private_set()
    caplog.set_level(logging.DEBUG)
    table, report = run_hotpate(
        texts, labels, ["good", "bad"], teachers=8, max_tokens=5, n_samples=4,
        epsilon=20.0, delta=1e-5, seed=2, source_factory=lambda prompts: StubSource(prompts),
    )  # fmt: skip
    assert caplog.records, "expected the run to log progress"
    assert CANARY not in caplog.text
    assert CANARY not in json.dumps(report, default=str)
    assert not any(CANARY in t for t in table.column("text").to_pylist())
    with pytest.raises(ValueError) as err:  # a bad label must not be echoed either
        run_hotpate(texts, [*labels[:-1], CANARY], ["good", "bad"], n_samples=1, epsilon=1.0, delta=1e-5,
                    source_factory=lambda prompts: StubSource(prompts))  # fmt: skip
    assert CANARY not in str(err.value)


# --------------------------------------------------------------------------------------------
# the real model
# --------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_kv_cache_reuse_matches_recomputing_the_prefix(smollm2_fp32):
    torch = pytest.importorskip("torch")

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # shared CPUs: one thread is far faster than two oversubscribed ones
    try:
        # SmolLM2 in float32, loaded once for this test and test_hotpate_vllm's first (conftest)
        _check_kv_cache_reuse(torch, smollm2_fp32)
    finally:
        torch.set_num_threads(threads)


def _check_kv_cache_reuse(torch, lm) -> None:
    from wasp_vllm.hotpate import TeacherEnsembleLM

    prompts = [
        "Pick a number between 1 and 10:",
        "Here are some colours: red, green, blue, yellow and purple. Name one more colour:",
        "Hi",
    ]  # different lengths: the shorter rows are left-padded
    for chat in (True, False):  # chat template, and the model as a plain LM (adds BOS if any)
        ens = TeacherEnsembleLM(lm, prompts, chat=chat)
        appended = [ens.encode(" Sure")[0], ens.encode(" 7")[0], ens.encode("!")[0]]
        cached = [ens.next_distributions()]
        for tok in appended:
            ens.append(tok)
            cached.append(ens.next_distributions())
        for row, text in enumerate(ens._format(prompts)):
            ids = lm.tokenizer(text, add_special_tokens=not chat).input_ids
            for step in range(len(appended) + 1):
                full = torch.tensor([ids + appended[:step]])
                with torch.inference_mode():
                    ref = torch.softmax(lm.model(input_ids=full).logits[0, -1].float(), -1).numpy()
                assert np.abs(ref - cached[step][row]).sum() < 1e-3
        ens.reset()  # back to the prompts: the next record starts from the same teachers
        ens.append(appended[0])
        assert np.allclose(ens.next_distributions(), cached[1], atol=1e-6)
    kept = TeacherEnsembleLM(lm, prompts, on_device=True).next_distributions()  # a GPU's rows stay there
    assert isinstance(kept, torch.Tensor)
    assert np.array_equal(kept.numpy(), TeacherEnsembleLM(lm, prompts).next_distributions())


def test_the_noise_comes_from_its_own_stream_not_the_public_randomness():
    """Same public randomness (coordination, fallback), other noise stream: other tokens."""
    probs = np.full((8, 16), 1 / 16)
    agg = HomogeneousAggregator(sigma=3.0, threshold=0.0)  # every release returns its noisy argmax

    def tokens(noise_seed: int) -> list[int | None]:
        sel = PrivateTokenSelector(
            agg, rng=np.random.default_rng(0), noise_rng=np.random.default_rng(noise_seed)
        )
        return [sel.select(probs, probs[0], []).token for _ in range(20)]

    assert tokens(1) == tokens(1)
    assert tokens(1) != tokens(2)


def test_the_cli_draws_hot_pate_noise_from_a_secret_key(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    import wasp_vllm.hotpate.generate as hotpate
    from wasp_vllm.cli import app
    from wasp_vllm.hotpate.report import HotPateReport

    seen = []

    def spy(*args, noise_rng, **kwargs):
        seen.append(noise_rng.bit_generator.seed_seq.entropy)
        keys = list(tmp_path.glob("*/private/noise.key"))  # this run's key only: the last one is gone
        assert [k.stat().st_mode & 0o777 for k in keys] == [0o600]
        nothing = HotPateReport(
            accounting="gaussian", guarantee={"epsilon": 0.0}, epsilon=4.0, delta=1e-5, plain_composition={},
            teachers_per_label=0, settings={}, labels={}, tokens_private=0, tokens_fallback_by_reason={},
            tokens_per_record=[], records_requested=0, records_written=0, records_empty_regenerated=0,
            token_decisions_in_empty_records=0, budget_exhausted=False,
        )  # fmt: skip
        return hotpate.pa.Table.from_pylist([], schema=hotpate.SCHEMA), nothing

    monkeypatch.setattr(hotpate, "run_hotpate", spy)
    private = tmp_path / "p.csv"
    private.write_text(
        "text,label\n" + "".join(f"review {i},{['positive', 'negative'][i % 2]}\n" for i in range(20))
    )
    for out in ("a", "b"):
        argv = ["hotpate", "--private", str(private), "--seed", "0", "--out", str(tmp_path / out)]
        result = CliRunner().invoke(app, argv)
        assert result.exit_code == 0, result.output
        # Hot PATE never resumes: its noise key is deleted when the run ends (issue 21, item 7)
        assert not (tmp_path / out / "private" / "noise.key").exists()
    assert seen[0] != seen[1] and min(seen) >= 2**192  # same public seed, different secret noise


class _CharTokenizerForTests:
    """Token ids are character codes: enough for the source's bookkeeping."""

    eos_token_id = 0

    def __call__(self, text, add_special_tokens=True):
        return types.SimpleNamespace(input_ids=[ord(c) % 50 + 1 for c in text])

    def get_vocab(self):
        return {}


class _RecordingLLMForTests:
    """Stands in for vllm.LLM: records each request and answers one top-1 log-probability."""

    def __init__(self):
        self.requests = []

    def generate(self, requests, params, use_tqdm=False):
        self.requests += list(requests)
        logprob = types.SimpleNamespace(rank=1, logprob=0.0)
        answer = types.SimpleNamespace(outputs=[types.SimpleNamespace(logprobs=[{3: logprob}])])
        return [answer] * len(requests)


def test_vllm_sources_never_share_prefix_cache_blocks():
    """The public row's source and each ensemble's source salt their requests differently, so the
    public prompt never reads KV blocks computed in a batch with private prompts."""
    pytest.importorskip("vllm")
    from wasp_vllm.hotpate.vllm_teachers import VLLMTeacherSource

    llm = _RecordingLLMForTests()
    loaded = types.SimpleNamespace(tokenizer=_CharTokenizerForTests(), llm=llm, chat=False, vocab_size=60,
                                   generation_eos=None)  # fmt: skip
    teachers = VLLMTeacherSource(loaded, ["private a", "private b"], top_k=1)
    public = VLLMTeacherSource(loaded, ["public"], top_k=1)
    teachers.next_distributions()
    public.next_distributions()
    salts = [r["cache_salt"] for r in llm.requests]
    assert salts[0] == salts[1] != salts[2]  # one salt per source, the same for all its rows
