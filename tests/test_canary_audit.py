"""``wasp-vllm audit`` (issue 21, item 12): canaries by secret coins, one run, a text-only membership
attack on the published files, and the one-run lower bound on epsilon.

The planted leak (the control): every prompt shows two of the private records - the canaries among
them - as in-context examples.  An audit must catch it (a lower bound above the claimed epsilon);
without it the bound must stay below the claim.  The fast tests use an engine double that echoes
its first in-context example (the subject is the audit's plumbing and statistics); the slow test
runs the real SmolLM2 engine.
"""

from __future__ import annotations

import itertools
import json
import random
import secrets
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

import wasp_vllm.pipeline as pipeline
import wasp_vllm.pipeline.prompts as prompts
from tests.fakes import FakeEngineForUnitTests, HashEmbedderForTests
from tests.privacy_checks import private_texts
from tests.shared_models import KeptOpenForOtherTests
from wasp_vllm.cli import app
from wasp_vllm.engines.base import Completion
from wasp_vllm.ops.audit import (
    AUDIT_FILE,
    MIN_ECHO,
    SIGNATURE_WORDS,
    Canary,
    CanaryDesign,
    audit,
    echo_scores,
    guess_membership,
    make_canaries,
)
from wasp_vllm.ops.canary_words import SeparatedWords, made_up_word
from wasp_vllm.pipeline.backends import Backends
from wasp_vllm.privacy.audit import one_run_epsilon_lower_bound, one_run_p_value

LABELS = ["positive", "neutral", "negative"]
SETTINGS: dict[str, Any] = dict(
    plms=["a"], task="drugs", n=96, rounds=2, q=2, s=2, private_limit=None, epsilon=0.5, label_check="off",
    label_prior="uniform",
)  # fmt: skip


def test_the_one_run_bound():
    assert one_run_epsilon_lower_bound(64, 32, 16, 1e-5) == 0.0  # chance level proves nothing
    all_right = one_run_epsilon_lower_bound(64, 32, 32, 1e-5)
    assert 2.2 < all_right < 2.4  # 32 right guesses cannot prove more than ~2.3 at 95 %
    assert one_run_epsilon_lower_bound(64, 32, 28, 1e-5) < all_right
    # delta's term makes the bound smaller, never larger
    assert one_run_epsilon_lower_bound(64, 32, 30, 1e-3) < one_run_epsilon_lower_bound(64, 32, 30, 0.0)
    # the p-value at the bound is the confidence level: the bound is the largest refuted epsilon
    assert one_run_p_value(64, 32, 30, one_run_epsilon_lower_bound(64, 32, 30, 1e-5), 1e-5) == pytest.approx(
        0.05, abs=1e-3
    )
    with pytest.raises(ValueError):
        one_run_p_value(10, 12, 3, 1.0, 1e-5)


def test_echo_scores_and_guesses():
    canaries = make_canaries(LABELS, 6, secrets.SystemRandom())
    assert len({c.signature for c in canaries}) == 6
    corpus = ["a review", f"something {canaries[2].signature} else", canaries[4].signature.split()[0]]
    scores = echo_scores(canaries, corpus)
    assert scores[2] == 1.0 and 0 < scores[4] < 1 and scores[[0, 1, 3, 5]].sum() == 0
    guess = guess_membership(scores, out_guesses=2, min_echo=0.05)
    assert guess[2] == 1 and guess[4] == 1 and (guess == -1).sum() == 2 and (guess == 0).sum() == 2
    assert guess_membership(scores).tolist() == [0, 0, 1, 0, 1, 0]  # one made-up word echoes
    assert guess_membership(scores, min_echo=0.2).tolist() == [0, 0, 1, 0, 0, 0]
    # one edit away (a misspelt copy) echoes, two edits do not
    word = canaries[0].signature.split()[0]
    assert echo_scores(canaries[:1], [word[:-1] + "q"])[0] == pytest.approx(1 / 6)
    assert echo_scores(canaries[:1], [word.capitalize() + "s."])[0] == pytest.approx(1 / 6)
    assert echo_scores(canaries[:1], ["qq" + word[2:]])[0] == 0
    assert echo_scores(canaries[:1], ["a" + word[:-1]])[0] == 0  # an insertion and a deletion: two edits
    with pytest.raises(ValueError, match="out guesses"):
        guess_membership(scores, out_guesses=6)


def _edit_distance(a: str, b: str) -> int:
    """Levenshtein distance by the textbook table (an independent check of the audit's bounded one)."""
    table = [[i + j if i * j == 0 else 0 for j in range(len(b) + 1)] for i in range(len(a) + 1)]
    for i in range(1, len(a) + 1):
        for j in range(1, len(b) + 1):
            table[i][j] = min(
                table[i - 1][j] + 1, table[i][j - 1] + 1, table[i - 1][j - 1] + (a[i - 1] != b[j - 1])
            )
    return table[-1][-1]


def test_a_misspelt_copy_of_one_canary_never_echoes_another():
    """Made-up words from a small syllable set: unchecked, 64 canaries held ~40 pairs of words two
    edits apart, so a PLM's one-letter slip in copying one canary was an "in" guess for another."""
    canaries = make_canaries(LABELS, 64, secrets.SystemRandom())
    words = [(k, w) for k, c in enumerate(canaries) for w in c.signature.split()]
    assert min(_edit_distance(a, b) for (i, a), (j, b) in itertools.combinations(words, 2)) >= 3
    for k, canary in enumerate(canaries):
        word = canary.signature.split()[k % SIGNATURE_WORDS]
        slip = word[:2] + ("q" if word[2] != "q" else "x") + word[3:]
        scores = echo_scores(canaries, [f"a review that copied {slip} once"])
        assert scores[k] > 0 and np.count_nonzero(scores) == 1


def test_the_word_index_finds_every_word_within_two_edits():
    """make_canaries compares a new word only with the taken words that share a left-out key with
    it; on short words of three letters (many pairs one and two edits apart) those hold every word
    the textbook distance puts within two edits."""
    rng = random.Random(5)
    words = ["".join(rng.choice("abc") for _ in range(rng.randint(3, 7))) for _ in range(300)]
    taken = SeparatedWords(3)
    taken.add(words)
    for word in words[:100]:
        near = {other for other in words if _edit_distance(word, other) <= 2}
        assert near <= taken.sharing_a_key(word), word
        assert any(_edit_distance(word, other) == 2 for other in near)  # the case a short key misses
        assert not taken.admits([word])


def test_words_a_plm_invents_in_the_canaries_style_seldom_echo_one():
    """A PLM shown made-up words writes more of its own from the same syllables.  1,500 such words
    (two to four syllables) echoed 4-8 of 64 three-syllable canaries (false "in" guesses: CI once saw
    10 of 13 guesses right under the planted leak, too few to refute the claim); four-syllable
    canaries, 0 in 39 draws of 40 and 1 in the other."""
    draw = random.Random(7)
    invented = [" ".join(made_up_word(draw, draw.choice((2, 3, 4))) for _ in range(10)) for _ in range(150)]
    scores = echo_scores(make_canaries(LABELS, 64, secrets.SystemRandom()), invented)
    assert np.count_nonzero(scores >= MIN_ECHO) <= 2


class EchoEngineForUnitTests(FakeEngineForUnitTests):
    """Writes back the first in-context example of its prompt (a PLM that copies), else fake text."""

    def generate(self, prompts_, seeds, params):
        out = super().generate(prompts_, seeds, params)
        for i, prompt in enumerate(prompts_):
            if 'is: "' in prompt and prompt.count('"') > 2:
                out[i] = Completion(prompt.split('is: "', 1)[1].split('"', 1)[0] + f" {seeds[i]}", 8)
        return out


@pytest.fixture
def planted_leak(monkeypatch):
    """The bug: private records (canaries among them) shown as in-context examples in every prompt."""
    private: list[str] = []
    real_prepare, real_build, draw = pipeline.prepare, prompts.build_prompt, random.Random(0)

    def prepare(cfg, **kw):
        ctx = real_prepare(cfg, **kw)
        private[:] = ctx.private.texts
        return ctx

    def build_prompt(task, kind, label, attribute, good=(), bad=()):
        leaked = draw.sample(private, 2) if private else []
        return real_build(task, "few_shot", label, attribute, good=leaked, bad=())

    monkeypatch.setattr(pipeline, "prepare", prepare)
    monkeypatch.setattr(prompts, "build_prompt", build_prompt)


def _records(n: int = 12) -> pd.DataFrame:
    return pd.DataFrame({"review": private_texts(n, seed=2), "rating": [LABELS[i % 3] for i in range(n)]})


def _fake_audit(out: Path):
    backends = Backends(lambda name, cfg: EchoEngineForUnitTests(name), HashEmbedderForTests())
    return audit(_records(), out=out, design=CanaryDesign(64), text_col="review", label_col="rating",
                 noise_seed=1, backends=backends, **SETTINGS)  # fmt: skip


def test_the_audit_stays_below_the_claim_without_a_leak(tmp_path):
    result = _fake_audit(tmp_path / "run")
    assert not result.refutes_claim and result.epsilon_claimed <= 0.5 + 1e-9
    coins = json.loads((tmp_path / "run" / "private" / AUDIT_FILE).read_text())["canaries"]
    assert len(coins) == 64 and 10 < sum(c["included"] for c in coins) < 54  # fair coins
    published = (tmp_path / "run" / "manifest.json").read_text()
    assert not any(c["text"] in published for c in coins)  # the coins stay with the operator


def test_the_audit_catches_private_records_in_prompts(tmp_path, planted_leak):
    result = _fake_audit(tmp_path / "run")
    assert result.refutes_claim, result.statement()
    assert "guarantee is false" in result.statement()


def test_the_cli_prints_claim_and_bound(tmp_path, monkeypatch):
    from tests.fakes import use_fake_backends

    use_fake_backends(monkeypatch)
    data = tmp_path / "p.csv"
    _records(30).to_csv(data, index=False)
    args = ["audit", "--private", str(data), "--text-col", "review", "--label-col", "rating", "--out",
            str(tmp_path / "a"), "--canaries", "16", "--plms", "a", "--n", "48", "--rounds", "2", "--q", "2",
            "--s", "2", "--m", "40", "--epsilon", "0.5"]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "claimed epsilon" in result.output and "lower bound" in result.output
    bad = CliRunner().invoke(app, [*args, "--canaries", "2", "--overwrite"])
    assert bad.exit_code != 0 and "at least 4 canaries" in bad.output


def test_canaries_are_records_of_the_task(tmp_path):
    canary = Canary("positive", "About positive:", "zorbla vintressa")
    assert canary.text == "About positive: zorbla vintressa"
    assert np.all(echo_scores([canary], [canary.text]) == 1.0)


def _real_audit(out: Path, engine: Any, embedder: Any):
    # 384 samples: each record is shown in about 10 prompts under the planted leak.  With 64 canaries
    # one false guess undoes a small count (8 of 9 right proves 0.28 at most), so the canaries' words
    # keep apart from what a PLM invents (four syllables): at 288 samples and epsilon 0.3, three-syllable
    # words gave 11/11, 8/9 and (CI) 10/13 under the leak, four-syllable 9/9, 9/9, 7/7; at 384 samples
    # 11/11 and 18/18, 0 guesses without the leak.  Epsilon 0.1: 5 of 5 right already refute 0.19.
    # The audit's power rests on these sizes: they stay.  The two runs share one real engine (conftest).
    settings = {**SETTINGS, "plms": ["smollm2"], "max_new_tokens": 40, "n": 384, "epsilon": 0.1}
    design = CanaryDesign(64)
    backends = Backends(lambda name, cfg: KeptOpenForOtherTests(engine), embedder)
    return audit(_records(), out=out, design=design, text_col="review", label_col="rating", backends=backends,
                 **settings)  # fmt: skip


@pytest.mark.slow
def test_the_audit_with_the_real_engine_catches_the_leak_and_holds_without_it(
    tmp_path, planted_leak, smollm2_vllm, embedder
):
    leaky = _real_audit(tmp_path / "leak", smollm2_vllm, embedder)
    print(f"planted leak: {leaky.statement()}")
    assert leaky.refutes_claim


@pytest.mark.slow
def test_the_audit_with_the_real_engine_stays_below_the_claim(tmp_path, smollm2_vllm, embedder):
    honest = _real_audit(tmp_path / "honest", smollm2_vllm, embedder)
    print(f"no leak: {honest.statement()}")
    assert not honest.refutes_claim


def test_canaries_fit_a_user_column_and_an_integer_label_column():
    """Each canary is one user's one record; labels go in as text whatever the column's type."""
    import pyarrow as pa

    from wasp_vllm.ops.audit import with_canaries

    table = pa.table({"body": ["a", "b"], "stars": pa.array([1, 0], pa.int64()), "who": ["u1", "u2"],
                      "genre": ["x", "y"]})  # fmt: skip
    canaries = make_canaries(["1", "0"], 3, secrets.SystemRandom())
    out = with_canaries(table, "body", "stars", canaries, user_col="who")
    assert out.num_rows == 5 and out.column("stars").to_pylist()[:2] == ["1", "0"]
    users = out.column("who").to_pylist()
    assert len(set(users)) == 5 and None not in users  # a distinct user id each
    assert out.column("genre").to_pylist()[2:] == [None] * 3


def test_the_audit_runs_at_user_level(tmp_path):
    records = _records(30).assign(user=[f"u{i % 10}" for i in range(30)])
    backends = Backends(lambda name, cfg: EchoEngineForUnitTests(name), HashEmbedderForTests())
    settings = {**SETTINGS, "privacy_unit": "user", "user_col": "user", "max_records_per_user": 3}
    result = audit(records, out=tmp_path / "run", design=CanaryDesign(16), text_col="review",
                   label_col="rating", noise_seed=1, backends=backends, **settings)  # fmt: skip
    assert not result.refutes_claim and result.canaries == 16
