"""The round policy: what a run does with each round's noisy votes and with each sample written.

A policy is the one seam for trying a variant of WASP's post-processing without a new option:
the benchmark harness prepares a run (``prepare(cfg, policy=...)``, or ``wasp_vllm.generate(...,
policy=...)``) with an experimental policy from ``benchmarks/quality/``; the product runs
:class:`PaperPolicy`, the paper's rules. A variant becomes an option only after the adoption rule
(docs/quality.md) adopts it.

A policy sees only public values: the noisy votes (already released and paid for), the synthetic
samples and their public embeddings, and the public noise scale. It cannot change what is released
(which histograms, their sensitivity, their noise): that is the privacy plan's, reviewed in
``privacy/``. So whatever a policy returns is differential-privacy post-processing. It may say
after which rounds the records vote (:meth:`RoundPolicy.votes_after`), from the round number
alone, fixed before the run starts: ``prepare(cfg, policy=...)`` makes the plan for that many
votes and hands the policy to the run with it, so the two cannot disagree.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from wasp_vllm.pipeline.selection import plm_weights, select_pools
from wasp_vllm.privacy.voting import NoisyVotes


@dataclass(frozen=True, eq=False)
class VotedSamples:
    """The public synthetic samples one vote ranked, row-aligned with its histograms."""

    texts: list[str]
    #: Label index of each sample (into the task's labels).
    labels: np.ndarray
    #: PLM index of each sample (into the run's PLMs).
    plms: np.ndarray
    #: Sentence embeddings (float32, one row per sample): public, from the synthetic text alone.
    embeddings: np.ndarray
    #: The round that wrote each sample (0 for the first).
    rounds: np.ndarray
    n_labels: int
    n_plms: int


@dataclass(frozen=True, eq=False)
class ChosenPools:
    """Per label index: row indices (into :class:`VotedSamples`) of the good and bad examples."""

    good: dict[int, np.ndarray]
    bad: dict[int, np.ndarray]


class RoundPolicy(Protocol):
    """What a round does with the noisy votes, and which samples it keeps."""

    #: Recorded in the run's state (a resume with another policy is refused) and, where it is not
    #: the paper's, in the manifest.
    name: str

    def pools(self, votes: NoisyVotes, samples: VotedSamples, s: int) -> ChosenPools:
        """Next round's in-context examples: at most ``s`` good and ``s`` bad rows per label."""
        ...

    def plm_weights(self, votes: NoisyVotes, samples: VotedSamples, previous: np.ndarray) -> np.ndarray:
        """Next round's PLM weights (non-negative, summing to 1) for methods that re-weight."""
        ...

    def reject(self, text: str, label: str, prompt: str) -> str | None:
        """Why a freshly written sample is turned down (it is regenerated), or None to keep it.
        Called after the product's own checks (empty, copy, echo of its prompt), before the label
        check."""
        ...

    def votes_after(self, t: int, rounds: int) -> bool:
        """Whether the records vote on the samples so far after round ``t`` of ``rounds`` (never
        after the last). A function of the round number alone: the plan counts the votes before
        the run. Rounds after a round without a vote keep the last pools and weights."""
        ...


class PaperPolicy:
    """The paper's WASP: pools are the top-S of the noisy H_near and H_far per label, PLM weights
    follow each PLM's noisy votes per sample, every sample the product's checks pass is kept."""

    name = "paper"

    def pools(self, votes: NoisyVotes, samples: VotedSamples, s: int) -> ChosenPools:
        chosen = select_pools(votes.h_near, votes.h_far, samples.labels, s, samples.n_labels)
        return ChosenPools(
            good={c: p.good for c, p in chosen.items()}, bad={c: p.bad for c, p in chosen.items()}
        )

    def plm_weights(self, votes: NoisyVotes, samples: VotedSamples, previous: np.ndarray) -> np.ndarray:
        return plm_weights(votes.h_near, samples.plms, samples.n_plms, previous)

    def reject(self, text: str, label: str, prompt: str) -> str | None:
        return None

    def votes_after(self, t: int, rounds: int) -> bool:
        return t < rounds - 1


#: The policy of every run that is not handed another one.
DEFAULT_POLICY: RoundPolicy = PaperPolicy()


def planned_votes(policy: RoundPolicy, rounds: int) -> int:
    """How many votes ``policy`` makes in a run of ``rounds`` rounds: the plan's compositions."""
    return sum(policy.votes_after(t, rounds) for t in range(rounds - 1))
