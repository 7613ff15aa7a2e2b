"""``wasp-vllm audit``: an empirical privacy audit of the user's own settings, from one real run.

1. ``m`` canary records are made: a public label phrase and a signature of made-up words that no
   model writes by chance.  Each goes into the private data by its own fair coin, drawn from the
   operating system's entropy and kept in ``out/private/audit.json`` (never published).
2. One real ``generate`` run on the private data plus the canaries that came up heads, with every
   setting the user gave.
3. A membership attack that sees only what the run publishes, the synthetic texts (the text-only
   threat model of "The Canary's Echo", Meeus et al. 2025): each canary's *echo score* is the
   share of its signature's made-up words that occur, exactly or one edit away, anywhere in the
   synthetic corpus.
   A canary that echoes (:data:`MIN_ECHO`) is guessed "in"; optionally the ``out_guesses`` lowest
   of the rest "out"; the others abstain.
4. One-run auditing (Steinke, Nasr & Jagielski 2023) turns the number of right guesses into a
   lower bound on the epsilon the run really has, at the chosen confidence
   (:func:`~wasp_vllm.privacy.audit.one_run_epsilon_lower_bound`).

Before it runs, the audit works out the most its design can show (:func:`~wasp_vllm.privacy.audit.
best_possible_bound`: a perfect attack, every guess right) and refuses to run when that cannot exceed
the claimed epsilon (``allow_weak`` runs it anyway, with a loud warning): such an audit would report
"no leak found" whatever the run leaks.  The canary count defaults to the fewest that can refute the
claim (:func:`~wasp_vllm.privacy.audit.canaries_to_refute`: 373 at epsilon 4), and every canary the
coins put in votes: the user's records are drawn to M first and the run's M makes room for the
canaries, so the ``--m`` draw never subsamples one away (sigma depends on whether records are drawn,
not on M).

A lower bound above the claimed epsilon proves the claim false (a bug, or a leak around the
mechanism).  A bound below it proves nothing about the claim: one run and a black-box attack see
only part of what a worst-case adversary could, so the bound is usually far below the claim.  The
audit's run spends privacy on the canaries like on any record: publish a separate run.
"""

from __future__ import annotations

import json
import logging
import math
import re
import secrets
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from wasp_vllm.ops.canary_words import MIN_SEPARATION, SeparatedWords, made_up_word
from wasp_vllm.pipeline.store import write_json
from wasp_vllm.privacy.audit import (
    best_possible_bound,
    canaries_to_refute,
    fewest_echoes_to_refute,
    one_run_epsilon_lower_bound,
    realised_ceiling,
)
from wasp_vllm.privacy.report import PrivacyReport

log = logging.getLogger(__name__)

SIGNATURE_WORDS = 6
AUDIT_FILE = "audit.json"


@dataclass(frozen=True)
class Canary:
    """One canary record: its label, its public lead-in and its signature of made-up words."""

    label: str
    lead: str
    signature: str

    @property
    def text(self) -> str:
        return f"{self.lead} {self.signature}"


@dataclass(frozen=True)
class CanaryDesign:
    """How an audit tests a run: ``canaries`` records put in by secret fair coins (None: the fewest
    that can refute the claimed epsilon), the attack's ``out_guesses`` (guess 'out' for that many
    least-echoed canaries too) and the confidence of the lower bound."""

    canaries: int | None = None
    out_guesses: int = 0
    confidence: float = 0.95

    def count(self, epsilon: float, delta: float) -> int | None:
        """The canaries asked for, else the fewest that can refute ``epsilon`` (None: no count can)."""
        if self.canaries is not None:
            return self.canaries
        return canaries_to_refute(epsilon, delta, self.confidence, self.out_guesses)

    def best_bound(self, canaries: int, delta: float) -> float:
        """The most this design can prove with ``canaries`` (a perfect attack)."""
        return best_possible_bound(canaries, delta, self.confidence, self.out_guesses)


@dataclass(frozen=True)
class CanaryAudit:
    """What the audit found: the claimed epsilon beside the lower bound from one run."""

    epsilon_claimed: float
    delta: float
    epsilon_lower_bound: float
    confidence: float
    canaries: int
    guesses: int
    correct: int
    out: str
    #: The most this design could prove (a perfect attack): above the claim, or the audit is weak.
    epsilon_best_possible: float = math.inf
    #: The canaries the coins put in, and the most this run could prove with them (a perfect attack).
    included: int = 0
    epsilon_ceiling: float = math.inf
    #: The fewest canaries put in that had to echo, none of the others by chance, to refute the claim.
    echoes_needed: int | None = None

    @property
    def refutes_claim(self) -> bool:
        return self.epsilon_lower_bound > self.epsilon_claimed

    @property
    def could_refute(self) -> bool:
        """Whether this run, with the coins it drew, could have refuted the claim at all."""
        return self.epsilon_ceiling > self.epsilon_claimed

    def statement(self) -> str:
        """What the figures show and what they do not, in plain words (for the operator, who holds
        the coins: it says how many canaries they put in)."""
        head = (
            f"claimed epsilon {self.epsilon_claimed:.3g} (delta {self.delta:.3g}); audited lower bound "
            f"{self.epsilon_lower_bound:.3g} at {self.confidence:.0%} confidence "
            f"({self.correct} of {self.guesses} membership guesses right; the coins put in {self.included} "
            f"of {self.canaries} canaries, with which a perfect attack proves at most "
            f"{self.epsilon_ceiling:.3g})."
        )
        if self.refutes_claim:
            return head + " The run leaks more than it claims: its guarantee is false. Do not publish it."
        if self.epsilon_best_possible <= self.epsilon_claimed:
            return head + (
                " WEAK AUDIT: even a perfect attack could not have refuted the claim with these canaries, "
                "so this shows nothing about it; use more canaries (the default count for this epsilon)."
            )
        if not self.could_refute:
            return head + (
                " WEAK RUN: with these coins even a perfect attack could not have refuted the claim, so "
                "this run shows nothing about it; audit again (new coins), or with more canaries."
            )
        return head + (
            f" This does not prove the claim. It would have refuted it only if at least {self.echoes_needed} "
            f"of the {self.included} canaries put in had echoed in the published text and none of the "
            f"{self.canaries - self.included} left out had (each chance echo raises that count): it shows "
            "that this text-only attack found no leak that visible, not that a worst-case attacker "
            "could not do better."
        )

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "refutes_claim": self.refutes_claim, "statement": self.statement()}


def make_canaries(labels: Sequence[str], m: int, rng: secrets.SystemRandom) -> list[Canary]:
    """``m`` canaries spread over the labels, each with a signature of made-up words.  Every word is
    at least :data:`MIN_SEPARATION` edits from every other canary's words, so a copy of one canary
    misspelt by one letter never counts as an echo of another (the attack's false "in" guesses)."""
    canaries: list[Canary] = []
    taken = SeparatedWords(MIN_SEPARATION)
    while len(canaries) < m:
        words = [made_up_word(rng) for _ in range(SIGNATURE_WORDS)]
        if not taken.admits(words):
            continue
        taken.add(words)
        label = labels[len(canaries) % len(labels)]
        canaries.append(Canary(label, f"About {label}:", " ".join(words)))
    return canaries


def _words(text: str) -> set[str]:
    return set(re.findall(r"[^\W\d_]+", text.lower()))  # letters only: "Lutrilo)" and "lutrilo3" count


def _deletions(word: str) -> set[tuple[int, str]]:
    """The word with one letter left out, each with the position it left out."""
    return {(i, word[:i] + word[i + 1 :]) for i in range(len(word))}


def echo_scores(canaries: Sequence[Canary], corpus: Sequence[str]) -> np.ndarray:
    """Per canary, the share of its signature's made-up words that occur in the corpus, exactly or
    one edit away (a PLM that copies a rare name now and then misspells it: "Lutrilo" for
    "lutrilo", "sofobou" for "sofobrou").  One edit, found through single-deletion variants: an
    insertion or deletion when one word is a deletion of the other, a substitution when both
    leave out the same position and agree on the rest."""
    words: set[str] = set()
    for text in corpus:
        words |= _words(text)
    shorter = {variant for w in words for _, variant in _deletions(w)}
    same_slot = set().union(*map(_deletions, words)) if words else set()

    def echoes(word: str) -> bool:
        mine = _deletions(word)
        return (
            word in words
            or word in shorter
            or any(variant in words for _, variant in mine)
            or bool(mine & same_slot)
        )

    scores = []
    for canary in canaries:
        signature = canary.signature.lower().split()
        scores.append(sum(echoes(w) for w in signature) / len(signature))
    return np.asarray(scores, dtype=np.float64)


#: An "in" guess needs this share of a canary's made-up words in the corpus (one of six): a fixed,
#: public rule.  Small PLMs copy a rare word of an example now and then, rarely a phrase (SmolLM2
#: under the planted leak of the tests, 384 samples: 11 and 18 included canaries echoed, none left
#: out; without the leak none of 64).  Chance echoes cost the attack power, never validity: a guess
#: that does not depend on the coins is right half the time.
MIN_ECHO = 1 / SIGNATURE_WORDS - 1e-9


def guess_membership(
    scores: np.ndarray, out_guesses: int = 0, min_echo: float = MIN_ECHO, seed: int = 0
) -> np.ndarray:
    """+1 (in) for every canary that echoes at least ``min_echo``, -1 (out) for the ``out_guesses``
    lowest of the others, 0 abstain.  The rule is a function of the published output alone, so the
    one-run bound holds whatever number of guesses it makes (Steinke et al. condition on it);
    ties go in a public random order, which carries no information about the coins."""
    echoed = scores >= min_echo
    if not 0 <= out_guesses <= int((~echoed).sum()):
        raise ValueError(f"out guesses must be in [0, {int((~echoed).sum())}] (the canaries not guessed in)")
    tie_break = np.random.default_rng(seed).random(scores.size)
    order = [i for i in np.lexsort((tie_break, scores)) if not echoed[i]]  # ascending score
    out = np.where(echoed, 1, 0).astype(np.int64)
    out[order[:out_guesses]] = -1
    return out


def with_canaries(
    table: pa.Table, text_col: str, label_col: str, canaries: Sequence[Canary], user_col: str | None = None
) -> pa.Table:
    """The private table plus the canaries, as the run will read it: text and label (the label
    column read as text, whatever its type), a user id of its own for each canary (each is one
    user's one record), other columns empty."""
    own = {text_col: [c.text for c in canaries], label_col: [c.label for c in canaries]}
    if user_col:
        own[user_col] = [f"wasp-audit-canary-{i}" for i in range(len(canaries))]
    merged = {}
    for name in table.column_names:
        values = table.column(name)
        if name in own:  # as text, so a canary's label and user id fit an integer column too
            values = values.cast(pa.string())
            merged[name] = pa.concat_arrays([values.combine_chunks(), pa.array(own[name], pa.string())])
        else:
            merged[name] = pa.concat_arrays([values.combine_chunks(), pa.nulls(len(canaries), values.type)])
    return pa.table(merged)


def score_run(
    out: Path, canaries: Sequence[Canary], included: np.ndarray, design: CanaryDesign
) -> CanaryAudit:
    """The attack on the run's published files only, and the one-run bound."""
    out_guesses, confidence = design.out_guesses, design.confidence
    privacy = PrivacyReport.from_json(json.loads((out / "manifest.json").read_text())["privacy"])
    texts = pq.read_table(out / "synthetic.parquet", columns=["text"]).column("text").to_pylist()
    scores = echo_scores(canaries, texts)
    guess = guess_membership(scores, min(out_guesses, int((scores < MIN_ECHO).sum())))
    truth = np.where(included, 1, -1)
    correct = int(np.sum((guess != 0) & (guess == truth)))
    claimed, delta = privacy.epsilon_spent, privacy.delta
    guesses, m, k = int(np.count_nonzero(guess)), len(canaries), int(np.count_nonzero(included))
    bound = one_run_epsilon_lower_bound(m, guesses, correct, delta, confidence)
    return CanaryAudit(
        claimed, delta, bound, confidence, m, guesses, correct, str(out), design.best_bound(m, delta), k,
        realised_ceiling(m, k, delta, confidence, out_guesses),
        fewest_echoes_to_refute(m, k, claimed, delta, confidence),
    )  # fmt: skip


def record_coins(out: Path, canaries: Sequence[Canary], included: np.ndarray) -> None:
    """The coins and canaries, for the operator only (they say which canaries the run saw)."""
    coins = [
        {"text": c.text, "label": c.label, "included": bool(i)}
        for c, i in zip(canaries, included, strict=True)
    ]
    write_json(out / "private" / AUDIT_FILE, {"canaries": coins})


def audit(
    private: Any = None,
    *,
    out: str | Path,
    design: CanaryDesign = CanaryDesign(),
    config: Any = None,
    overwrite: bool = False,
    backends: Any = None,
    progress: Any = None,
    allow_weak: bool = False,
    **settings: Any,
) -> CanaryAudit:
    """Insert canaries by secret coins, make one real run with these settings, attack its published
    files and bound epsilon from below (module docstring).  Refuses (ConfigError) a design that
    cannot refute the claimed epsilon, unless ``allow_weak``."""
    from wasp_vllm.api import generate, run_config
    from wasp_vllm.pipeline import Collaborators
    from wasp_vllm.tasks import get_task

    cfg = run_config(private, config, settings)
    canaries = _checked_canaries(design, cfg.epsilon, cfg.delta, allow_weak)
    table, columns = _private_table(private, cfg)
    coin = secrets.SystemRandom()
    made = make_canaries(get_task(cfg.task).labels, canaries, coin)
    included = np.array([coin.random() < 0.5 for _ in made])
    chosen = [c for c, i in zip(made, included, strict=True) if i]
    data = with_canaries(table, str(columns["text_col"]), str(columns["label_col"]), chosen, cfg.user_col)
    own = {k: v for k, v in cfg.model_dump().items() if k != "private"} | columns
    if cfg.private_limit is not None:  # room for every canary: the draw then keeps every row
        own["private_limit"] = cfg.private_limit + canaries
    # The audit's run is not the user's: nothing of it reaches a later run's plan.
    generate(data, out=out, overwrite=overwrite, progress=progress,
             collaborators=Collaborators(backends=backends, record_throughput=False), **own)  # fmt: skip
    record_coins(Path(out), made, included)
    result = score_run(Path(out), made, included, design)
    write_json(Path(out) / "private" / "audit_result.json", result.to_json())
    return result


def _checked_canaries(design: CanaryDesign, epsilon: float, delta: float, allow_weak: bool) -> int:
    """The canary count, once it is clear the design can refute ``epsilon`` (else refused or warned)."""
    from wasp_vllm.config import ConfigError

    if design.canaries is not None and design.canaries < 4:
        raise ConfigError("an audit needs at least 4 canaries")
    canaries = design.count(epsilon, delta)
    if canaries is None:
        message = (f"no number of canaries lets this audit refute epsilon={epsilon:g} at delta={delta:g} "
                   "(the delta term grows with the count): audit a smaller epsilon")  # fmt: skip
        if not allow_weak:
            raise ConfigError(message + ", or pass --allow-weak")
        canaries = 1000
        log.warning("WEAK AUDIT: %s; running with %d canaries as asked (--allow-weak)", message, canaries)
    if not 0 <= design.out_guesses < canaries:
        raise ConfigError(f"out guesses must be in [0, {canaries - 1}]")
    best = design.best_bound(canaries, delta)
    if best <= epsilon:
        needed = canaries_to_refute(epsilon, delta, design.confidence, design.out_guesses)
        more = f"use --canaries {needed} or more" if needed else "audit a smaller epsilon"
        message = (f"this audit cannot refute epsilon={epsilon:g}: with {canaries} canaries even a "
                   f"perfect attack proves at most epsilon >= {best:.3g} ({design.confidence:.0%} "
                   f"confidence); {more}")  # fmt: skip
        if not allow_weak:
            raise ConfigError(f"{message}, or pass --allow-weak")
        log.warning("WEAK AUDIT: %s. Its result will say nothing about the claim (--allow-weak)", message)
    return canaries


def _private_table(private: Any, cfg: Any) -> tuple[pa.Table, dict[str, str | None]]:
    """The user's private records as a table (drawn to M, as the run would draw them: at random by
    the public seed), and the columns holding text, label and attribute."""
    from wasp_vllm.api import as_table
    from wasp_vllm.config import ConfigError
    from wasp_vllm.data.resolve import source_table

    table = as_table(private)
    columns: dict[str, str | None] = {
        "text_col": cfg.text_col, "label_col": cfg.label_col, "attribute_col": cfg.attribute_col
    }  # fmt: skip
    if table is None:
        table, builtin = source_table(cfg.private, "fit")
        if builtin is not None:
            columns = {"text_col": builtin.text_col, "label_col": builtin.label_col,
                       "attribute_col": builtin.attribute_col}  # fmt: skip
    if columns["text_col"] is None or columns["label_col"] is None:
        raise ConfigError(
            "an audit needs the private data's text and label columns (--text-col, --label-col)"
        )
    if cfg.private_limit is not None and table.num_rows > cfg.private_limit:
        keep = np.random.default_rng(cfg.seed).choice(table.num_rows, cfg.private_limit, replace=False)
        table = table.take(np.sort(keep))
    return table, columns
