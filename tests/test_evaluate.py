"""Tests of wasp_vllm.evaluation: FID and label balance, the task-model logic, the Parquet edge, plots."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import wasp_vllm.evaluation.runner as runner
from wasp_vllm.evaluation import (
    BertClassifier,
    BertSettings,
    EvalReport,
    EvaluationError,
    LabelledTexts,
    LogRegClassifier,
    MetricError,
    evaluate_private_only,
    evaluate_synthetic,
    fid,
    fid_per_round,
    frechet_distance,
    label_balance,
    plot_accuracy,
    plot_fid_rounds,
    resolve_bert_path,
    train_and_score,
)
from wasp_vllm.evaluation.settings import EvalSettings
from wasp_vllm.tasks import get_task

# ----- a test double for the embedder --------------------------------------------------------------


class LookupEmbedderDouble:
    """Test double for wasp_vllm.engines.embedder.Embedder: returns a fixed vector per known text.

    The subject of these tests is the classifier and evaluation logic, not the embedder, so the
    embedding of each text is chosen by the test (e.g. two separated clusters).
    """

    name = "lookup-double"

    def __init__(self, table: dict[str, np.ndarray]) -> None:
        self.table = table
        self.dim = len(next(iter(table.values())))
        self.calls = 0

    def encode(self, texts: list[str]) -> np.ndarray:
        self.calls += 1
        return np.stack([self.table[t] for t in texts]).astype(np.float32)


def _cluster_data(n_per_label: int, n_labels: int, dim: int, sep: float, seed: int, prefix: str):
    """Texts, integer labels and a text->vector table with one Gaussian cluster per label."""
    rng = np.random.default_rng(seed)
    centers = np.eye(n_labels, dim) * sep
    texts, labels, table = [], [], {}
    for c in range(n_labels):
        for i in range(n_per_label):
            text = f"{prefix}-{c}-{i}"
            texts.append(text)
            labels.append(c)
            table[text] = centers[c] + rng.normal(size=dim)
    return texts, np.asarray(labels, dtype=np.int64), table


@pytest.fixture(scope="module")
def clusters():
    """Separable 3-label train/test sets in 16 dims with a shared lookup embedder."""
    tr_texts, tr_y, tr_table = _cluster_data(60, 3, 16, sep=6.0, seed=1, prefix="train")
    te_texts, te_y, te_table = _cluster_data(60, 3, 16, sep=6.0, seed=2, prefix="test")
    return tr_texts, tr_y, te_texts, te_y, LookupEmbedderDouble({**tr_table, **te_table})


NAMES3 = ["a", "b", "c"]

# ----- FID ----------------------------------------------------------------------------------------


def test_fid_identical_sets_is_zero_also_when_n_below_d():
    rng = np.random.default_rng(0)
    many = rng.normal(size=(300, 8))
    few = rng.normal(size=(10, 32)).astype(np.float32)  # n < d: singular covariance
    assert fid(many, many) == pytest.approx(0.0, abs=1e-8)
    assert fid(few, few) == pytest.approx(0.0, abs=1e-5)


def test_frechet_distance_matches_closed_form_for_diagonal_gaussians():
    # Diagonal covariances commute: FID = |dmu|^2 + sum (sqrt(a) - sqrt(b))^2.
    a, b = np.array([1.0, 4.0, 9.0]), np.array([4.0, 1.0, 9.0])
    mu1, mu2 = np.zeros(3), np.array([1.0, 2.0, -2.0])
    expected = 9.0 + float(((np.sqrt(a) - np.sqrt(b)) ** 2).sum())
    for method in ("sqrtm", "eigh"):
        got = frechet_distance(mu1, np.diag(a), mu2, np.diag(b), method=method)
        assert got == pytest.approx(expected, rel=1e-10)


def test_fid_grows_with_mean_shift_as_the_closed_form_says():
    # Same known covariance, mean shifted by m: FID -> |m|^2 (sampling noise only).
    rng = np.random.default_rng(3)
    d, n = 4, 40_000
    chol = np.linalg.cholesky(
        np.array([[2.0, 0.5, 0, 0], [0.5, 1.0, 0, 0], [0, 0, 1.5, 0.3], [0, 0, 0.3, 0.5]])
    )
    base = rng.normal(size=(n, d)) @ chol.T
    other = rng.normal(size=(n, d)) @ chol.T
    direction = np.array([1.0, -1.0, 0.5, 2.0]) / np.sqrt(6.25)
    values = []
    for shift in (0.0, 1.0, 2.0, 4.0):
        value = fid(base, other + shift * direction)
        assert value == pytest.approx(shift**2, abs=0.02 + 0.02 * shift**2)
        values.append(value)
    assert values == sorted(values)


def test_fid_is_symmetric_and_methods_agree_when_n_below_d():
    rng = np.random.default_rng(4)
    a = rng.normal(size=(12, 40))
    b = rng.normal(size=(20, 40)) + 0.3
    ab, ba = fid(a, b), fid(b, a)
    assert np.isfinite(ab) and ab > 0
    assert ab == pytest.approx(ba, rel=1e-6)
    assert fid(a, b, method="eigh") == pytest.approx(ab, rel=1e-5)


def test_fid_rejects_bad_inputs():
    rng = np.random.default_rng(5)
    with pytest.raises(MetricError, match="at least 2"):
        fid(rng.normal(size=(1, 4)), rng.normal(size=(5, 4)))
    with pytest.raises(MetricError, match="dimensions differ"):
        fid(rng.normal(size=(5, 4)), rng.normal(size=(5, 3)))
    with pytest.raises(MetricError, match="NaN"):
        fid(np.full((3, 2), np.nan), rng.normal(size=(5, 2)))
    with pytest.raises(MetricError, match="unknown FID method"):
        fid(rng.normal(size=(5, 2)), rng.normal(size=(5, 2)), method="magic")


def test_fid_per_round_is_cumulative():
    rng = np.random.default_rng(6)
    private = rng.normal(size=(50, 6))
    synth = np.concatenate([rng.normal(size=(30, 6)) + 3.0 - r for r in range(3)])  # drifts toward private
    rounds = np.repeat([0, 1, 2], 30)
    perm = rng.permutation(len(rounds))  # row order must not matter
    curve = fid_per_round(synth[perm], rounds[perm], private)
    assert list(curve) == [0, 1, 2]
    for t in range(3):
        assert curve[t] == pytest.approx(fid(synth[rounds <= t], private))
    assert curve[2] == pytest.approx(fid(synth, private))
    assert curve[0] > curve[1] > curve[2]
    with pytest.raises(MetricError):
        fid_per_round(synth, rounds[:-1], private)


# ----- label balance ------------------------------------------------------------------------------


def test_label_balance_counts_names_and_indices_with_zeros():
    assert label_balance(np.array([0, 2, 2, 0, 0]), NAMES3) == {"a": 3, "b": 0, "c": 2}
    assert label_balance(["c", "a", "c"], NAMES3) == {"a": 1, "b": 0, "c": 2}
    assert label_balance([], NAMES3) == {"a": 0, "b": 0, "c": 0}
    with pytest.raises(EvaluationError, match="not label names"):
        label_balance(["a", "zebra"], NAMES3)
    with pytest.raises(EvaluationError, match="out of range"):
        label_balance([0, 3], NAMES3)


# ----- the task model -----------------------------------------------------------------------------


def test_logreg_reaches_high_accuracy_on_separable_data(clusters):
    tr_texts, tr_y, te_texts, te_y, embedder = clusters
    train, test = LabelledTexts(tr_texts, tr_y), LabelledTexts(te_texts, te_y)
    report = train_and_score(train, test, NAMES3, LogRegClassifier(embedder), seed=0)
    assert report.accuracy > 0.95 and report.macro_f1 > 0.95
    assert set(report.per_label_f1) == set(NAMES3)
    assert report.train_label_counts == {"a": 60, "b": 60, "c": 60}
    assert (report.n_train, report.n_test, report.embedder) == (180, 180, "lookup-double")
    assert not report.degenerate and report.missing_train_labels == []
    assert report.even_mix_macro_f1 == pytest.approx(report.macro_f1)  # the test mix is even already
    json.dumps(report.to_dict())  # JSON-serialisable


def test_logreg_is_at_chance_on_label_shuffled_data():
    # Shuffling the labels of noise embeddings leaves nothing to learn: accuracy ~ 1/3 on 900
    # test points (sd ~ 0.016).  Separated clusters would not do: the model would then predict
    # each cluster's majority shuffled label, an all-or-nothing outcome per cluster.
    tr_texts, tr_y, tr_table = _cluster_data(100, 3, 16, sep=0.0, seed=11, prefix="train")
    te_texts, te_y, te_table = _cluster_data(300, 3, 16, sep=0.0, seed=12, prefix="test")
    embedder = LookupEmbedderDouble({**tr_table, **te_table})
    shuffled = np.random.default_rng(7).permutation(tr_y)
    report = train_and_score(
        LabelledTexts(tr_texts, shuffled), LabelledTexts(te_texts, te_y), NAMES3, LogRegClassifier(embedder)
    )
    assert abs(report.accuracy - 1 / 3) < 0.07


def test_logreg_is_deterministic_and_accepts_label_names(clusters):
    tr_texts, tr_y, te_texts, te_y, embedder = clusters
    train, test = LabelledTexts(tr_texts, tr_y), LabelledTexts(te_texts, te_y)
    first = train_and_score(train, test, NAMES3, LogRegClassifier(embedder), seed=0)
    names = [NAMES3[i] for i in tr_y]
    second = train_and_score(LabelledTexts(tr_texts, names), test, NAMES3, LogRegClassifier(embedder), seed=0)
    assert first.to_dict() == second.to_dict()


def test_precomputed_embeddings_skip_the_embedder(clusters):
    tr_texts, tr_y, te_texts, te_y, embedder = clusters
    before = embedder.calls
    report = train_and_score(
        LabelledTexts(tr_texts, tr_y, embeddings=embedder.encode(tr_texts)),
        LabelledTexts(te_texts, te_y, embeddings=embedder.encode(te_texts)),
        NAMES3,
        LogRegClassifier(embedder),
    )
    assert embedder.calls == before + 2 and report.accuracy > 0.95


def test_label_absent_from_training_set_is_reported(clusters):
    tr_texts, tr_y, te_texts, te_y, embedder = clusters
    test = LabelledTexts(te_texts, te_y)
    keep = tr_y != 2
    report = train_and_score(
        LabelledTexts([t for t, k in zip(tr_texts, keep, strict=True) if k], tr_y[keep]),
        test,
        NAMES3,
        LogRegClassifier(embedder),
    )
    assert report.missing_train_labels == ["c"]
    assert report.train_label_counts["c"] == 0 and not report.degenerate
    assert report.per_label_f1["c"] == 0.0  # in the test set, never predicted
    assert 0.6 < report.accuracy < 0.7  # a and b right, c always wrong
    assert any("absent" in note for note in report.notes)


def test_single_class_training_set_gives_a_flagged_constant_predictor(clusters):
    tr_texts, tr_y, te_texts, te_y, embedder = clusters
    test = LabelledTexts(te_texts, te_y)
    calls = embedder.calls
    report = train_and_score(
        LabelledTexts(tr_texts[:5], np.zeros(5, dtype=int)),
        test,
        NAMES3,
        LogRegClassifier(embedder),
    )
    assert report.degenerate
    assert report.accuracy == pytest.approx(1 / 3)
    assert report.missing_train_labels == ["b", "c"]
    assert report.per_label_f1["b"] == 0.0
    assert embedder.calls == calls  # nothing to embed for a constant


def test_the_even_mix_score_gives_a_majority_guess_no_credit_for_an_uneven_test_split(clusters):
    tr_texts, _, te_texts, te_y, embedder = clusters
    uneven = np.concatenate([np.flatnonzero(te_y == 0)[:45], np.flatnonzero(te_y == 1)[:5]])
    test = LabelledTexts([te_texts[i] for i in uneven], te_y[uneven])
    report = train_and_score(
        LabelledTexts(tr_texts[:5], np.zeros(5, dtype=int)), test, NAMES3, LogRegClassifier(embedder)
    )
    # always "a": F1(a) = 2 * 0.9 / 1.9 on the split as it is; on an even mix a's precision is 1/2
    assert report.macro_f1 == pytest.approx((2 * 0.9 / 1.9 + 0) / 2)
    assert report.even_mix_macro_f1 == pytest.approx((2 * 0.5 / 1.5 + 0) / 2)


def test_train_and_score_error_cases(clusters):
    tr_texts, tr_y, te_texts, te_y, embedder = clusters
    train, test = LabelledTexts(tr_texts, tr_y), LabelledTexts(te_texts, te_y)
    with pytest.raises(EvaluationError, match="training set is empty"):
        train_and_score(LabelledTexts([], []), test, NAMES3, LogRegClassifier(embedder))
    with pytest.raises(EvaluationError, match="test set is empty"):
        train_and_score(train, LabelledTexts([], []), NAMES3, LogRegClassifier(embedder))
    with pytest.raises(EvaluationError, match="texts but"):
        train_and_score(LabelledTexts(tr_texts, tr_y[:-1]), test, NAMES3, LogRegClassifier(embedder))
    with pytest.raises(ValueError, match="model"):  # the settings name the task model, and refuse others
        EvalSettings(test="drugs", model="svm")
    with pytest.raises(EvaluationError, match="out of range"):
        train_and_score(LabelledTexts(tr_texts, tr_y + 1), test, NAMES3, LogRegClassifier(embedder))


def test_bert_without_a_local_model_is_a_clear_error(tmp_path):
    with pytest.raises(EvaluationError, match="neither a model directory"):
        resolve_bert_path(tmp_path / "no-such-model")
    with pytest.raises(EvaluationError, match="no config.json"):
        resolve_bert_path(tmp_path)
    with pytest.raises(EvaluationError, match="needs a local"):
        train_and_score(
            LabelledTexts(["x", "y"], [0, 1]),
            LabelledTexts(["z"], [0]),
            ["p", "q"],
            BertClassifier(BertSettings(path=tmp_path / "missing")),
        )


def _tiny_bert_dir(path: Path) -> Path:
    """A randomly initialised 2-layer BERT with a 30-word vocabulary: exercises the fine-tuning code only."""
    import torch
    from transformers import BertConfig, BertForSequenceClassification, BertTokenizer

    torch.manual_seed(0)  # the random initial weights, so the test does not depend on test order

    words = ["great", "wonderful", "loved", "awful", "terrible", "hated", "movie", "the", "it"]
    (path / "vocab.txt").parent.mkdir(parents=True, exist_ok=True)
    (path / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words]) + "\n")
    BertTokenizer(str(path / "vocab.txt")).save_pretrained(path)  # positional: transformers 4 and 5
    config = BertConfig(
        vocab_size=len(words) + 5,
        hidden_size=16,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=32,
    )
    BertForSequenceClassification(config).save_pretrained(path)
    return path


def test_bert_fine_tunes_a_local_encoder_directory(tmp_path):
    from wasp_vllm.evaluation import BertSettings

    bert = _tiny_bert_dir(tmp_path / "tiny-bert")
    pos = ["great movie", "wonderful movie", "loved it", "the movie was great"]
    neg = ["awful movie", "terrible movie", "hated it", "the movie was awful"]
    texts, labels = pos * 4 + neg * 4, [0] * 16 + [1] * 16
    settings = BertSettings(epochs=15, batch_size=8, learning_rate=5e-3, device="cpu")
    report = train_and_score(
        LabelledTexts(texts, labels),
        LabelledTexts(pos + neg, [0] * 4 + [1] * 4),
        ["pos", "neg"],
        BertClassifier(settings.at(bert)),
    )
    assert report.model == "bert" and report.embedder is None and report.n_test == 8
    assert report.accuracy >= 0.75


# ----- the Parquet edge: evaluate_synthetic / evaluate_private_only ---------------------------------


def _write_csv(path: Path, rows: list[tuple[str, str]]) -> str:
    with path.open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["text", "label"])
        writer.writerows(rows)
    return str(path)


@pytest.fixture()
def imdb_files(tmp_path):
    """A synthetic Parquet (3 rounds, stored 8-d embeddings, junk rows), test and private CSVs."""
    rng = np.random.default_rng(8)
    centers = {"positive": np.full(8, 2.0), "negative": np.full(8, -2.0)}
    table: dict[str, np.ndarray] = {}

    def texts_for(prefix: str, label: str, n: int) -> list[str]:
        out = [f"{prefix} {label} {i}" for i in range(n)]
        table.update({t: centers[label] + rng.normal(size=8) for t in out})
        return out

    # the label descriptions sit at their label's centre (evaluate scores them beside the set)
    table.update({get_task("imdb").label_text(lab): centers[lab] for lab in centers})
    rows = [(t, lab, r) for r in range(3) for lab in centers for t in texts_for(f"synth r{r}", lab, 10)]
    rows += [(None, "positive", 2), ("junk text", "not-a-label", 2)]
    emb = [table.get(t, np.zeros(8)) if t else np.zeros(8) for t, _, _ in rows]
    synth = pa.table(
        {
            "id": [str(i) for i in range(len(rows))],
            "text": [t for t, _, _ in rows],
            "label": [lab for _, lab, _ in rows],
            "attribute": [None] * len(rows),
            "plm": ["smollm2" if i % 2 else "gemma3" for i in range(len(rows))],
            "round": pa.array([r for _, _, r in rows], type=pa.int32()),
            "prompt_kind": ["zero_shot"] * len(rows),
            "embedding": pa.FixedSizeListArray.from_arrays(
                pa.array(np.concatenate(emb).astype(np.float32)), 8
            ),
        }
    )
    pq.write_table(synth, tmp_path / "synthetic.parquet")
    test_rows = [(t, lab) for lab in centers for t in texts_for("test", lab, 15)]
    private_rows = [(t, lab) for lab in centers for t in texts_for("private", lab, 12)]
    return {
        "synthetic": str(tmp_path / "synthetic.parquet"),
        "test": _write_csv(tmp_path / "test.csv", test_rows),
        "private": _write_csv(tmp_path / "private.csv", private_rows),
        "embedder": LookupEmbedderDouble(table),
    }


def test_evaluate_synthetic_end_to_end(imdb_files):
    enc = imdb_files["embedder"]
    calls = enc.calls
    scored = EvalSettings(test=imdb_files["test"], task="imdb", private=imdb_files["private"])
    scores = evaluate_synthetic(imdb_files["synthetic"], scored, embedder=enc)
    result = scores.to_json()
    json.dumps(result)
    assert scores.accuracy == result["accuracy"] and scores.counts.n_synthetic == 60
    assert "operator_only" not in scores.published() and scores.published()["accuracy"] == scores.accuracy
    assert result["n_synthetic"] == 60 and result["n_rows"] == 62
    assert (result["n_dropped_null_text"], result["n_dropped_unknown_label"]) == (1, 1)
    assert result["reused_stored_embeddings"] is True
    # the test set (once), the private set and the label descriptions: stored synthetic embeddings reused
    assert enc.calls == calls + 3
    assert result["label_balance"] == {"positive": 30, "negative": 30}
    assert result["per_round_counts"] == {"0": 20, "1": 20, "2": 20}
    assert result["accuracy"] > 0.95
    assert scores.published()["even_mix_macro_f1"] == scores.classifier.even_mix_macro_f1 > 0.95
    operator = result["operator_only"]  # FID against raw private records: never published
    assert "NEVER to be published" in operator["note"]
    assert operator["fid"] is not None and operator["fid"] >= 0
    assert sorted(operator["fid_per_round"]) == [0, 1, 2]
    assert operator["fid_per_round"][2] == pytest.approx(operator["fid"])
    assert not {"fid", "n_private"} & set(result)  # nothing about the private set outside that section


def test_evaluate_synthetic_re_embeds_when_stored_dimension_differs(imdb_files):
    table = {t: np.concatenate([v, v]) for t, v in imdb_files["embedder"].table.items()}  # 16-d
    enc = LookupEmbedderDouble(table)
    scored = EvalSettings(test=imdb_files["test"], task="imdb")
    result = evaluate_synthetic(imdb_files["synthetic"], scored, embedder=enc).to_json()
    assert result["reused_stored_embeddings"] is False and "operator_only" not in result
    assert enc.calls == 3  # the synthetic and test sets, the label descriptions
    assert result["accuracy"] > 0.95


def test_evaluate_synthetic_rejects_a_file_without_usable_rows(tmp_path, imdb_files):
    path = tmp_path / "bad.parquet"
    pq.write_table(pa.table({"text": ["x"], "label": ["nope"]}), path)
    scored = EvalSettings(test=imdb_files["test"], task="imdb")
    with pytest.raises(EvaluationError, match="no usable"):
        evaluate_synthetic(path, scored, embedder=imdb_files["embedder"])
    pq.write_table(pa.table({"text": ["x"]}), path)
    with pytest.raises(EvaluationError, match="missing column"):
        evaluate_synthetic(path, scored, embedder=imdb_files["embedder"])


def test_evaluate_private_only_baseline(imdb_files):
    scored = EvalSettings(test=imdb_files["test"], task="imdb", private=imdb_files["private"])
    result = evaluate_private_only(scored, embedder=imdb_files["embedder"]).to_json()
    json.dumps(result)
    assert result["kind"] == "only_private" and result["differentially_private"] is False
    assert result["n_private"] == 24 and result["accuracy"] > 0.95
    assert result["even_mix_macro_f1"] == result["classifier"]["even_mix_macro_f1"] > 0.95


# ----- plots --------------------------------------------------------------------------------------


def test_plots_write_png_files(tmp_path):
    fid_path = plot_fid_rounds(
        {"WASP": {0: 30.0, 1: 22.0, 2: 18.5}, "Aug-PE": {"0": 30.0, "1": 27.0}}, tmp_path / "f.png"
    )
    acc_path = plot_accuracy({"WASP": (0.81, 0.02), "OnlyPrivate": (0.7, None)}, tmp_path / "sub" / "a.png")
    for path in (fid_path, acc_path):
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# ----- the real packaged embedder ------------------------------------------------------------------


@pytest.mark.slow
def test_logreg_with_the_real_embedder_beats_chance(embedder):
    positive = [
        "I loved this film, it was wonderful.",
        "An absolute delight from start to finish.",
        "Brilliant acting and a beautiful story.",
        "One of the best movies I have ever seen.",
        "Great fun, I would happily watch it again.",
        "A heartwarming and joyful experience.",
    ]
    negative = [
        "I hated this film, it was awful.",
        "A boring mess from start to finish.",
        "Terrible acting and a stupid story.",
        "One of the worst movies I have ever seen.",
        "A waste of time, I walked out early.",
        "Dull, depressing and badly made.",
    ]
    test_pos = ["What a fantastic, moving movie.", "I really enjoyed it, superb.", "Lovely and charming."]
    test_neg = ["Dreadful, I regret watching it.", "Awful plot and bad acting.", "Painfully boring."]
    report = train_and_score(
        LabelledTexts(positive + negative, [0] * 6 + [1] * 6),
        LabelledTexts(test_pos + test_neg, [0] * 3 + [1] * 3),
        ["positive", "negative"],
        LogRegClassifier(embedder),  # the session's real packaged embedder (conftest)
    )
    assert report.embedder and report.accuracy > 0.5 + 1e-9
    assert report.accuracy >= 5 / 6


def test_eval_report_round_trips_to_dict():
    report = EvalReport("logreg", 0.5, 0.4, {"a": 0.5}, {"a": 1}, {"a": 2}, [], 1, 2)
    assert report.to_dict()["per_label_f1"] == {"a": 0.5}


def test_a_bert_task_model_still_gets_the_label_agreement_of_a_reference(tmp_path, imdb_files, monkeypatch):
    """FID and the label agreement are measured on sentence embeddings whatever the task model is."""
    from wasp_vllm.evaluation import BertSettings

    made = []  # the settings' embedder, made because the reference needs it
    monkeypatch.setattr(runner, "_make_embedder", lambda spec: made.append(spec) or imdb_files["embedder"])
    scored = EvalSettings(test=imdb_files["test"], task="imdb", model="bert", reference=imdb_files["private"],
                          bert_path=str(_tiny_bert_dir(tmp_path / "tiny-bert")))  # fmt: skip
    settings = BertSettings(epochs=1, batch_size=8, device="cpu")
    result = evaluate_synthetic(imdb_files["synthetic"], scored, bert_settings=settings)
    assert result.model == "bert" and made == ["auto"]
    assert result.operator is not None and result.operator.label_agreement is not None
    assert 0.0 <= result.operator.label_agreement.overall <= 1.0
