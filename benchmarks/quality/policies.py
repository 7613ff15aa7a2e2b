"""Experimental round policies: how a variant of WASP is tried without a new option.

A policy implements ``wasp_vllm.pipeline.policy.RoundPolicy`` (the next round's pools from the noisy
votes, the PLM weights, whether a freshly written sample is kept); it sees only public values, so
whatever it returns is post-processing of what was released.  Register one here by name and the
tasks grid measures it as the method ``policy-NAME`` against WASP (``grid.py --methods
wasp,policy-NAME``); the harness prepares the run with it (``prepare(cfg, policy=...)``), never through
``RunConfig``, and keys the run's record by its name.  A variant becomes an option of the product
only after the adoption rule (``lever_rule.py``, docs/quality.md) adopts it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from benchmarks.quality import round_stats  # the same figure the tasks grid reports per vote
from wasp_vllm.pipeline import label_check
from wasp_vllm.pipeline.policy import ChosenPools, PaperPolicy, VotedSamples
from wasp_vllm.pipeline.selection import select_pools
from wasp_vllm.privacy.voting import NoisyVotes


def signal_share(votes: NoisyVotes) -> float:
    """The share of the noisy near-votes' variance that the public noise does not explain,
    ``1 - sigma^2 / var(H_near)`` (0 where the votes are no more spread than noise alone)."""
    return round_stats.signal_share(votes.h_near, votes.sigma) or 0.0


class ZeroShotFallbackPolicy(PaperPolicy):
    """The paper's rules, except after a vote where :meth:`falls_back` says so: then the next round
    shows no examples (a label without a pool is prompted zero-shot) and every PLM gets an equal
    share, as FuseGen's rounds do. Subclasses say when, from public values only."""

    def falls_back(self, votes: NoisyVotes, samples: VotedSamples) -> bool:
        raise NotImplementedError

    def pools(self, votes: NoisyVotes, samples: VotedSamples, s: int) -> ChosenPools:
        if not self.falls_back(votes, samples):
            return super().pools(votes, samples, s)
        none = {label: np.zeros(0, dtype=np.int64) for label in range(samples.n_labels)}
        return ChosenPools(good=none, bad=dict(none))

    def plm_weights(self, votes: NoisyVotes, samples: VotedSamples, previous: np.ndarray) -> np.ndarray:
        if not self.falls_back(votes, samples):
            return super().plm_weights(votes, samples, previous)
        return np.full(samples.n_plms, 1.0 / samples.n_plms)


class SignalSwitchPolicy(ZeroShotFallbackPolicy):
    """The paper's rules where the votes carry signal; where ``signal_share`` is below
    ``threshold``, the next round is zero-shot with equal PLM shares. Computed from the noisy
    histograms and the public sigma only: post-processing, no privacy cost."""

    def __init__(self, threshold: float = 0.25) -> None:
        self.threshold = threshold
        self.name = f"signal-switch-{threshold:g}"

    def falls_back(self, votes: NoisyVotes, samples: VotedSamples) -> bool:
        return signal_share(votes) < self.threshold


class DiversePoolsPolicy(PaperPolicy):
    """The paper's rules, but each label's good pool is ``S`` samples spread out among its ``2S``
    best voted: the best voted first, then each time the candidate least like (cosine of the public
    embeddings) those already chosen. Aimed at the narrowing the tasks grid measures (WASP's
    same-label cosine rises by 0.10-0.17 from round 0 to the last on the five test tasks, FuseGen's
    stays level): the PLMs copy the examples they are shown, so showing near-copies narrows."""

    name = "diverse-pools"

    def pools(self, votes: NoisyVotes, samples: VotedSamples, s: int) -> ChosenPools:
        wide = select_pools(votes.h_near, None, samples.labels, 2 * s, samples.n_labels)
        good = {c: spread_out(p.good, samples.embeddings, s) for c, p in wide.items()}
        return beside_papers_bad(good, super().pools(votes, samples, s))


class WidePoolsPolicy(PaperPolicy):
    """The paper's rules, but each label's good pool is its ``widen * S`` best voted, and each of
    a label's example draws (``--example-sets`` per PLM and round) is a random ``S`` of them. With
    the paper's pool of exactly ``S``, every prompt of a label shows the same ``S`` samples, so the
    next round's samples of that label are all written after one set of examples; after round 0 the
    votes are mostly noise (signal share 0.12-0.16 on the newer tasks), so the wider pool gives up
    little of what the private data chose."""

    def __init__(self, widen: int = 4) -> None:
        self.widen = widen
        self.name = f"wide-pools-{widen}"

    def pools(self, votes: NoisyVotes, samples: VotedSamples, s: int) -> ChosenPools:
        wide = select_pools(votes.h_near, None, samples.labels, self.widen * s, samples.n_labels)
        return beside_papers_bad({c: p.good for c, p in wide.items()}, super().pools(votes, samples, s))


class DiversityGuardPolicy(ZeroShotFallbackPolicy):
    """The paper's rules while the loop keeps round 0's diversity. After a round whose same-label
    cosine (the mean cosine of two of its samples of one label, on their public embeddings) is
    above round 0's, the next round is zero-shot with equal PLM shares; once a round is back at
    round 0's level, the paper's rules return. Aimed at the narrowing the tasks grid measures
    (issue 59): the PLMs copy the examples they are shown, and round 0, written without examples,
    is the yardstick. Public: synthetic samples only."""

    name = "diversity-guard"

    def falls_back(self, votes: NoisyVotes, samples: VotedSamples) -> bool:
        newest = int(samples.rounds.max(initial=0))
        if newest == 0:
            return False
        first, last = (cosine_of_round(samples, t) for t in (0, newest))
        return first is not None and last is not None and last > first


class FirstRoundPoolsPolicy(PaperPolicy):
    """The paper's rules, but each label's good pool is the ``widen * S`` best voted of round 0's
    samples alone, ranked by the sum of every noisy vote they have had so far; each of a label's
    example draws is a random ``S`` of them. Aimed at both causes docs/quality.md measured: the PLMs
    copy their examples, so examples from a later round are copies of copies (round 0, written
    without examples, is the widest); and after round 0 one vote is mostly noise, where the sum of
    ``k`` votes has ``k`` times the signal and only ``sqrt(k)`` times the noise. The sum is of
    released histograms: post-processing, no privacy cost. The bad pool is the paper's.

    Round 0's rows come first in every vote (each ranks the samples written so far, oldest first),
    so a row index names the same sample from vote to vote. ``pools`` is called once per vote and
    adds that vote to the sums; a new instance per run."""

    def __init__(self, widen: int = 4) -> None:
        self.widen = widen
        self.name = f"first-round-pools-{widen}"
        self._texts: list[str] = []
        self._near_sum = np.zeros(0)

    def pools(self, votes: NoisyVotes, samples: VotedSamples, s: int) -> ChosenPools:
        first = samples.rounds == 0
        self._add(votes, samples, int(first.sum()))
        near = np.asarray(votes.h_near, dtype=float).copy()
        near[: self._near_sum.size] = self._near_sum
        wide = select_pools(near, None, samples.labels, self.widen * s, samples.n_labels, eligible=first)
        return beside_papers_bad({c: p.good for c, p in wide.items()}, super().pools(votes, samples, s))

    def _add(self, votes: NoisyVotes, samples: VotedSamples, n_first: int) -> None:
        texts = samples.texts[:n_first]
        if self._texts and self._texts != texts:
            raise ValueError("first-round-pools: round 0's samples changed between votes (a reused policy?)")
        near = np.asarray(votes.h_near[:n_first], dtype=float)
        self._near_sum = near if not self._texts else self._near_sum + near
        self._texts = texts


class NoCloseCopiesPolicy(PaperPolicy):
    """The paper's pools and weights, but a freshly written sample whose sentence embedding is
    nearer (cosine) to one of the examples its prompt shows than round 0's samples come to their
    nearest same-label neighbour (the ``quantile`` of those cosines) is turned down and written
    again (reason ``close_copy``). A lexical cap (more than half a sample's word 4-grams in its
    prompt) hardly bit, 2-5 of ~60 samples a round on drugs: the copying is of meaning. On drugs'
    validation run, half of round 1's samples sit nearer an example they were shown (cosine 0.56)
    than round 0's samples sit to their nearest neighbour of ~30 (0.44). Reads only samples and
    examples: no privacy cost.
    A new instance per run (it keeps the run's examples)."""

    def __init__(self, quantile: float = 0.95) -> None:
        self.quantile = quantile
        self.name = f"no-close-copies-{quantile:g}"
        self._ceiling: float | None = None  # set at the first vote, from round 0's samples
        self._examples: dict[str, np.ndarray] = {}  # every example chosen so far: unit embedding
        self._embedder: Any = None
        self._lock = threading.Lock()  # PLMs write (and so are checked) in threads

    def pools(self, votes: NoisyVotes, samples: VotedSamples, s: int) -> ChosenPools:
        chosen = super().pools(votes, samples, s)
        unit = unit_rows(samples.embeddings)
        if self._ceiling is None:
            first = samples.rounds == 0
            self._ceiling = nearest_neighbour_cosine(unit[first], samples.labels[first], self.quantile)
        for rows in (*chosen.good.values(), *chosen.bad.values()):
            self._examples.update((samples.texts[r], unit[r]) for r in rows)
        return chosen

    def reject(self, text: str, label: str, prompt: str) -> str | None:
        shown = [vec for example, vec in self._examples.items() if example in prompt]
        if self._ceiling is None or not shown:  # round 0, or a zero-shot prompt
            return None
        with self._lock:
            if self._embedder is None:
                from benchmarks.quality.harness import (
                    EMBEDDER,  # the runs' embedder (harness imports this module)
                )
                from wasp_vllm.engines.embedder import Embedder

                self._embedder = Embedder(EMBEDDER)
            vec = unit_rows(self._embedder.encode([text]))[0]
        return "close_copy" if float((np.stack(shown) @ vec).max()) > self._ceiling else None


class StrongVotesPolicy(PaperPolicy):
    """The paper's pools and weights, but the records vote only after the first ``votes`` rounds,
    and the privacy plan spends the whole budget on those: with the exact accountant sigma falls by
    ``sqrt((T - 1) / votes)`` (2x for one vote of five rounds). The rounds after the last vote keep
    its pools and PLM weights. Aimed at the votes being mostly noise (signal share 0.12-0.17 a vote,
    docs/quality.md): the one vote's is 0.65-0.79 on the choosing tasks' validation runs, so what the
    prompts show was chosen by the private data; and round 0, written without examples, is the
    widest set to choose from. The vote rounds are fixed before the run: public."""

    def __init__(self, votes: int = 1) -> None:
        self.votes = votes
        self.name = f"strong-votes-{votes}"

    def votes_after(self, t: int, rounds: int) -> bool:
        return t < min(self.votes, rounds - 1)


def unit_rows(matrix: np.ndarray) -> np.ndarray:
    """Each row scaled to unit length, in float64 (the label check's, at a policy's precision)."""
    return label_check.unit_rows(matrix, np.float64)


def nearest_neighbour_cosine(unit: np.ndarray, labels: np.ndarray, quantile: float) -> float:
    """The ``quantile`` of each row's cosine to its nearest other row of the same label (unit rows);
    1 where no label has two rows (nothing is closer than that)."""
    nearest: list[float] = []
    for label in np.unique(labels):
        vecs = unit[labels == label]
        if len(vecs) < 2:
            continue
        cos = vecs @ vecs.T
        np.fill_diagonal(cos, -np.inf)
        nearest.extend(cos.max(axis=1).tolist())
    return float(np.quantile(nearest, quantile)) if nearest else 1.0


def beside_papers_bad(good: dict[int, np.ndarray], paper: ChosenPools) -> ChosenPools:
    """A policy's own good pools beside the paper's bad ones, less any sample now in a good pool
    (a sample is shown as a good example or a bad one, never both)."""
    bad = {c: np.setdiff1d(paper.bad[c], good[c], assume_unique=True) for c in paper.bad}
    return ChosenPools(good=good, bad=bad)


def cosine_of_round(samples: VotedSamples, t: int) -> float | None:
    """The same-label cosine of the samples round ``t`` wrote."""
    mine = samples.rounds == t
    return round_stats.same_label_cosine(samples.embeddings[mine], samples.labels[mine])


def spread_out(rows: np.ndarray, embeddings: np.ndarray, s: int) -> np.ndarray:
    """``s`` of ``rows`` (best first), greedily farthest apart: the first row, then each time the
    row whose highest cosine to those chosen is lowest."""
    if len(rows) <= s:
        return rows
    unit = unit_rows(embeddings[rows])
    picked = [0]
    while len(picked) < s:
        nearest = (unit @ unit[picked].T).max(axis=1)
        nearest[picked] = np.inf
        picked.append(int(np.argmin(nearest)))
    return rows[picked]


#: name -> (label in the tables, a factory of the policy).  Every experiment measured before the
#: seam was decided (docs/levers-not-adopted.md); these are the ones under trial now (issue 59).
POLICIES: dict[str, tuple[str, Callable[[], Any]]] = {
    # After round 0 the votes are mostly noise (signal share 0.04-0.07 on four validation tasks,
    # docs/quality.md): below a quarter, show no examples and keep the PLMs even, as FuseGen does.
    "signal-switch": ("WASP, zero-shot and even PLMs where the votes are mostly noise", SignalSwitchPolicy),
    # The loop narrows the data (same-label cosine, issue 59): show examples unlike each other.
    "diverse-pools": ("WASP, each label's examples spread out among its 2S best voted", DiversePoolsPolicy),
    # Every prompt of a label shows the same S examples with the paper's pools: draw them from more.
    "wide-pools": ("WASP, each prompt's examples a random S of its label's 4S best voted", WidePoolsPolicy),
    # The PLMs copy their examples (same-label cosine within a PLM rises as much as overall): where a
    # round came out narrower than round 0, write the next one zero-shot.
    "diversity-guard": (
        "WASP, a zero-shot round after each round narrower than round 0",
        DiversityGuardPolicy,
    ),
    # Copies of copies narrow, and one vote after round 0 is mostly noise: show round 0's samples,
    # ranked by all the votes they have had.
    "first-round-pools": (
        "WASP, each prompt's examples a random S of round 0's 4S best by all votes so far",
        FirstRoundPoolsPolicy,
    ),
    # The narrowing is of meaning more than words: turn down a sample nearer an example it was shown
    # than round 0's samples come to each other.
    "no-close-copies": (
        "WASP, a sample nearer an example it was shown than round 0's samples to each other written again",
        NoCloseCopiesPolicy,
    ),
    # After round 0 a vote is mostly noise: spend the whole budget on one vote after round 0 (sigma
    # halved at T = 5) and show what it chose in every later round.
    "strong-votes": (
        "WASP, one vote after round 0 at the whole budget (sigma halved at T = 5)",
        StrongVotesPolicy,
    ),
}


def policy_of(name: str) -> Any:
    """A fresh instance of the registered policy ``name``; KeyError names the registered ones."""
    if name not in POLICIES:
        raise KeyError(
            f"no experimental policy {name!r}; registered: {', '.join(sorted(POLICIES)) or 'none'}"
        )
    return POLICIES[name][1]()
