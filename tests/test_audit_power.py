"""An audit that says what it can show (issue 57, item 2).

Before it runs, ``wasp-vllm audit`` works out the best lower bound its design allows (a perfect
attack: every canary the coins put in guessed "in", all right) and refuses, exit 2, when that cannot
exceed the claimed epsilon; ``--allow-weak`` runs it with a loud warning.  Its default canary count
is the fewest that can refute the claim (373 at epsilon 4), and every canary the coins put in votes,
whatever ``--m``: at the old defaults (64 canaries, epsilon 4, ``--m 100``) the best bound any leak
could give was 2.32, and 0.43 on the built-in data, where the draw kept about 6 canaries.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

import wasp_vllm.ops.audit as audit_module
import wasp_vllm.pipeline as pipeline
from tests.fakes import HashEmbedderForTests, use_fake_backends
from tests.privacy_checks import private_texts
from tests.test_canary_audit import LABELS, EchoEngineForUnitTests, planted_leak  # noqa: F401 - a fixture
from wasp_vllm.cli import app
from wasp_vllm.cli.audit import AUDIT_SETTINGS
from wasp_vllm.config import ConfigError
from wasp_vllm.ops.audit import AUDIT_FILE, CanaryAudit, CanaryDesign, audit
from wasp_vllm.pipeline.backends import Backends
from wasp_vllm.privacy.audit import (
    MOST_CANARIES,
    best_possible_bound,
    canaries_to_refute,
    fewest_echoes_to_refute,
    one_run_epsilon_lower_bound,
    realised_ceiling,
)

DELTA = 1e-5


def test_the_default_canary_count_can_refute_the_claim():
    assert CanaryDesign().count(4.0, DELTA) == canaries_to_refute(4.0, DELTA) == 373
    assert best_possible_bound(373, DELTA) > 4.0 > best_possible_bound(300, DELTA)
    assert best_possible_bound(64, DELTA) == pytest.approx(2.32, abs=0.01)  # the old default: weak
    for epsilon in (0.5, 1.0, 2.0):  # more canaries for a larger claim
        need = canaries_to_refute(epsilon, DELTA)
        assert need is not None and best_possible_bound(need, DELTA) > epsilon
        assert need < canaries_to_refute(epsilon * 2, DELTA)
    assert canaries_to_refute(8.0, DELTA) is None  # out of reach at any count up to MOST_CANARIES
    assert best_possible_bound(MOST_CANARIES, DELTA) < 8.0


def _audit_of(included: int, guesses: int, correct: int) -> CanaryAudit:
    """What ``score_run`` makes of an audit at the defaults (373 canaries, epsilon 4)."""
    bound = one_run_epsilon_lower_bound(373, guesses, correct, DELTA)
    return CanaryAudit(4.0, DELTA, bound, 0.95, 373, guesses, correct, "run", best_possible_bound(373, DELTA),
                       included, realised_ceiling(373, included, DELTA),
                       fewest_echoes_to_refute(373, included, 4.0, DELTA))  # fmt: skip


def test_the_audit_says_what_this_run_could_show_from_the_coins_it_drew():
    """At 373 canaries epsilon 4 is refuted only if about 90 % of the canaries put in echo and no
    left-out one does: the statement says so, from the coins the operator holds, and calls a draw
    that puts in too few canaries for any attack a weak run."""
    assert fewest_echoes_to_refute(373, 186, 4.0, DELTA) == 167  # 90 % of the 186 put in
    assert one_run_epsilon_lower_bound(373, 188, 186, DELTA) < 4.0  # two chance echoes: no refutation
    typical = _audit_of(included=186, guesses=20, correct=20)
    assert typical.could_refute and typical.echoes_needed == 167 and not typical.refutes_claim
    words = typical.statement()
    assert "put in 186 of 373 canaries" in words and "at least 167 of the 186" in words
    assert "none of the 187 left out" in words and "does not prove the claim" in words
    few = _audit_of(included=160, guesses=20, correct=20)  # a draw about 1.4 sd below half
    assert few.epsilon_ceiling < 4.0 < few.epsilon_best_possible and few.echoes_needed is None
    assert not few.could_refute and "WEAK RUN" in few.statement()
    leak = _audit_of(included=186, guesses=180, correct=180)
    assert leak.refutes_claim and "guarantee is false" in leak.statement()


def _records(n: int) -> pd.DataFrame:
    return pd.DataFrame({"review": private_texts(n, seed=2), "rating": [LABELS[i % 3] for i in range(n)]})


def _cli_args(tmp_path: Path, *extra: str) -> list[str]:
    data = tmp_path / "p.csv"
    _records(30).to_csv(data, index=False)
    return ["audit", "--private", str(data), "--text-col", "review", "--label-col", "rating", "--out",
            str(tmp_path / "a"), "--plms", "a", "--n", "48", "--rounds", "2", "--q", "2", "--s", "2",
            *extra]  # fmt: skip


def test_a_weak_audit_is_refused_before_anything_runs(tmp_path, monkeypatch):
    use_fake_backends(monkeypatch)
    weak = CliRunner().invoke(app, _cli_args(tmp_path, "--canaries", "64", "--epsilon", "4"))
    assert weak.exit_code == 2, weak.output
    (line,) = [x for x in weak.output.splitlines() if x.startswith("error:")]
    assert "cannot refute epsilon=4" in line and "2.32" in line and "--canaries 373" in line
    assert "--allow-weak" in line and not (tmp_path / "a").exists()  # nothing ran, nothing written
    args = _cli_args(tmp_path, "--canaries", "16", "--epsilon", "4", "--allow-weak")
    allowed = CliRunner().invoke(app, args)
    assert allowed.exit_code == 0, allowed.output
    assert allowed.output.count("WEAK AUDIT") == 2  # loud: the warning before the run, and its result
    with pytest.raises(ConfigError, match="no number of canaries"):
        audit(_records(30), out=tmp_path / "b", text_col="review", label_col="rating", epsilon=8.0)


def test_audit_lists_the_options_an_audit_needs():
    shown = CliRunner().invoke(app, ["audit", "--help"], env={"COLUMNS": "200"}).output
    assert "--epsilon" in shown and "--m " in shown and "--allow-weak" in shown and "--config" in shown
    for unrelated in ("--engine-arg", "--top-p", "--noise-seed", "--license"):
        assert unrelated not in shown
    assert len(AUDIT_SETTINGS) < 30


def test_every_canary_votes_whatever_m(tmp_path, monkeypatch):
    """--m 5: the user's records are drawn to 5 and every canary the coins put in votes too."""
    voters: list[list[str]] = []
    real_prepare = pipeline.prepare

    def prepare(cfg, **kw):
        ctx = real_prepare(cfg, **kw)
        voters.append(list(ctx.private.texts))
        return ctx

    monkeypatch.setattr(pipeline, "prepare", prepare)
    backends = Backends(lambda name, cfg: EchoEngineForUnitTests(name), HashEmbedderForTests())
    result = audit(_records(30), out=tmp_path / "run", design=CanaryDesign(24), text_col="review",
                   label_col="rating", noise_seed=1, backends=backends, plms=["a"], n=48, rounds=2, q=2, s=2,
                   private_limit=5, epsilon=0.5)  # fmt: skip
    coins = json.loads((tmp_path / "run" / "private" / AUDIT_FILE).read_text())["canaries"]
    (voting,) = voters
    included = [c["text"] for c in coins if c["included"]]
    assert included and all(text in voting for text in included)
    assert len(voting) == 5 + len(included) and result.canaries == 24
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert manifest["privacy"]["plan"]["neighbour"] == "replace"  # drawn, as the user's run: same sigma


def _fake_audit_at_the_defaults(out: Path, n: int, monkeypatch):
    # Public coins, so that the slow test is the same every time (a real audit's are secret): this
    # seed puts in 206 of the 373 canaries (186.5 expected).
    monkeypatch.setattr(audit_module.secrets, "SystemRandom", lambda: random.Random(1))
    backends = Backends(lambda name, cfg: EchoEngineForUnitTests(name), HashEmbedderForTests())
    return audit(_records(12), out=out, text_col="review", label_col="rating", noise_seed=1,
                 backends=backends, plms=["a"], n=n, rounds=2, q=2, s=2, label_check="off",
                 label_prior="uniform", epsilon=4.0)  # fmt: skip


@pytest.mark.slow
def test_at_the_default_epsilon_a_planted_leak_is_caught(tmp_path, monkeypatch, planted_leak):  # noqa: F811
    """Epsilon 4 with its default 373 canaries, on an engine double that copies its first in-context
    example: the planted leak (two private records in every prompt) refutes the claim."""
    leak = _fake_audit_at_the_defaults(tmp_path / "leak", 4000, monkeypatch)
    print(f"planted leak: {leak.statement()}")
    assert leak.canaries == 373 and leak.epsilon_best_possible > 4.0
    assert leak.refutes_claim, leak.statement()


@pytest.mark.slow
def test_at_the_default_epsilon_no_leak_stays_below_the_claim(tmp_path, monkeypatch):
    honest = _fake_audit_at_the_defaults(tmp_path / "honest", 4000, monkeypatch)
    print(f"no leak: {honest.statement()}")
    assert honest.canaries == 373 and not honest.refutes_claim
