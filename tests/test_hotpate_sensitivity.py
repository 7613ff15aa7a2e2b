"""Hot PATE's sensitivities, found by brute force rather than argued (issue 21, item 1).

For random neighbouring private files (one record added or removed; with an ``--m`` draw, whatever
that does to the kept set), the real ``--m`` draw and the real teacher-prompt builder decide which
teachers of which label change.  An adversary then gives every teacher a one-hot next-token
distribution: ``x`` for each prompt of the first file, ``y`` for each prompt only the second has -
the worst case, every changed teacher moving its vote the same way (coordinated sampling makes it
the typical one).  The real coordinated ensemble draws the votes.  The moves must stay within what
each label's accountant assumes, and the run's published epsilon must be the one recomputed at the
worst move found: exactly, since the worst case is attained.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from wasp_vllm.data.records import PrivateSet, draw_records
from wasp_vllm.hotpate.ensembles import PreparedEnsemble, VoteHistogram
from wasp_vllm.hotpate.prompts import build_teacher_prompts
from wasp_vllm.hotpate.report import LabelRun, guarantee
from wasp_vllm.hotpate.settings import HotPateSettings
from wasp_vllm.hotpate.steps import GaussianStep
from wasp_vllm.privacy.gaussian import epsilon_for_sigma

LABELS = ["good", "bad"]
VOCAB, X, Y = 16, 3, 11


def _file(rng: np.random.Generator, n: int) -> PrivateSet:
    texts = [f"record {i} {rng.integers(10**9)}" for i in range(n)]
    return PrivateSet(texts, rng.integers(0, len(LABELS), n), list(LABELS))


def _neighbour(rng: np.random.Generator, data: PrivateSet) -> tuple[PrivateSet, PrivateSet]:
    """``data`` and ``data`` with one record more (of a random label): the file-level relation."""
    extra = PrivateSet(
        [f"new record {rng.integers(10**9)}"], np.array([rng.integers(len(LABELS))]), list(LABELS)
    )
    both = PrivateSet(data.texts + extra.texts, np.append(data.labels, extra.labels), list(LABELS))
    return data, both


def _teacher_prompts(data: PrivateSet, s: HotPateSettings, n: int) -> dict[str, list[str]]:
    by_label = {}
    for i, name in enumerate(LABELS):
        texts = [t for t, lab in zip(data.texts, data.labels, strict=True) if lab == i]
        prompts = build_teacher_prompts(
            texts, n, name, s.seed, s.examples_shown(), s.task, s.max_example_chars
        )
        by_label[name] = prompts[:-1]  # the last prompt is the public one, not a teacher
    return by_label


def _histogram(prompts: list[str], known: set[str], rng: np.random.Generator) -> np.ndarray:
    """The adversary's one-hot teachers (``x`` for known prompts, ``y`` for new ones), drawn."""
    probs = np.zeros((len(prompts), VOCAB))
    probs[np.arange(len(prompts)), [X if p in known else Y for p in prompts]] = 1.0
    votes = PreparedEnsemble(probs, "coordinated").votes(rng)
    return VoteHistogram.from_votes(votes, VOCAB).dense()


def _moves(s: HotPateSettings, trials: int, file_size: int) -> list[dict[str, np.ndarray]]:
    """Per trial and label, the histogram move between the two neighbouring files' kept records."""
    rng = np.random.default_rng(0)
    n = s.teachers_per_label(len(LABELS))
    moves = []
    for _ in range(trials):
        small, large = _neighbour(rng, _file(rng, file_size))
        kept = [
            draw_records(d, s.requested_m, s.seed) if s.neighbour == "replace" else d for d in (small, large)
        ]
        before, after = (_teacher_prompts(d, s, n) for d in kept)
        moves.append(
            {
                name: _histogram(after[name], set(before[name]), rng)
                - _histogram(before[name], set(before[name]), rng)
                for name in LABELS
            }
        )
    return moves


def _settings(accounting: str, neighbour: str, k: int = 1) -> HotPateSettings:
    # replace = an --m draw from a larger file (the CLI always draws); add/remove = every record votes
    return HotPateSettings(
        n_samples=4, epsilon=4.0, delta=1e-5, accounting=accounting,  # type: ignore[arg-type]
        neighbour=neighbour, requested_m=24, records_per_teacher=k,
    )  # fmt: skip


CASES = [
    (a, nb, k) for a in ("gaussian", "target-charging") for nb in ("add_remove", "replace") for k in (1, 3)
]


@pytest.mark.parametrize(("accounting", "neighbour", "k"), CASES)
def test_no_neighbouring_file_moves_the_histograms_more_than_the_ledger_assumes(accounting, neighbour, k):
    s = _settings(accounting, neighbour, k)
    budget = s.budget()
    moves = _moves(s, trials=150, file_size=40 if neighbour == "replace" else 24)
    l2 = [math.sqrt(sum(float(d @ d) for d in m.values())) for m in moves]
    top_count = [max(float(np.abs(d).max()) / 1.0 for d in m.values()) for m in moves]
    labels_touched = [sum(bool(np.any(d)) for d in m.values()) for m in moves]
    if accounting == "gaussian":
        # Every label's ledger gets the whole budget at budget.sensitivity: the moves of all labels
        # together must fit in one such release (sum of squares: Gaussian DP composes in mu^2).
        assert max(l2) <= budget.sensitivity + 1e-12
        assert max(l2) == pytest.approx(budget.sensitivity)  # attained: the bound is tight, not loose
    else:
        assert max(top_count) <= budget.votes_changed
        # each touched label spends its (eps, delta); they add up to at most the run's budget
        assert max(labels_touched) * budget.epsilon <= s.epsilon + 1e-12


@pytest.mark.parametrize("neighbour", ["add_remove", "replace"])
def test_the_published_epsilon_is_the_one_at_the_worst_move(neighbour):
    s = _settings("gaussian", neighbour)
    worst = max(math.sqrt(sum(float(d @ d) for d in m.values())) for m in _moves(s, 150, 40))
    n = 1000  # enough teachers that the threshold rule's sigma affords some releases
    runs = [LabelRun(name, 2, s.make_step(n, VOCAB, 2)) for name in LABELS]
    published = guarantee(s, s.budget(), runs)["epsilon"]
    step = runs[0].step
    assert isinstance(step, GaussianStep)
    cap = step.cap()
    assert cap
    at_worst = epsilon_for_sigma(step.aggregator.sigma, s.delta, worst, cap)
    assert published == pytest.approx(at_worst, rel=1e-9)
    assert published <= s.epsilon
