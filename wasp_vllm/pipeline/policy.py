"""The round policy: what a run does with each round's noisy votes and with each sample written.

A policy is the one seam for trying a variant of WASP's post-processing without a new option:
the benchmark harness hands ``wasp_vllm.generate(..., policy=...)`` an experimental policy; the
product runs :class:`PaperPolicy`, the paper's rules. A variant becomes an option only after the
adoption rule (docs/research) adopts it.

The contract, which the run checks (:func:`check_policy`):

* **Public inputs only.** Every method receives the run's :class:`PolicyContext` (task, embedder,
  PLMs, S, rounds, the plan's noise scale) and one public value: a :class:`Vote` (the noisy votes,
  already released and paid for, the samples they rank, the run's earlier votes) or a sample just
  written with its whole :class:`~wasp_vllm.pipeline.prompts.Slot` (label, attribute, prompt kind,
  prompt, the good and bad examples it showed, the PLM). A policy never sees a private record, a
  clean histogram or the noise key, so whatever it returns is post-processing.
* **Stateless.** A policy is a frozen dataclass: its fields are its settings, and every answer is a
  function of its arguments. A resumed run therefore answers as the killed one would have; the
  run records the policy's name and settings and refuses a resume with others.
* **The plan owns the schedule.** A policy may ask after which rounds the records vote
  (:meth:`RoundPolicy.vote_request`, from the number of rounds alone, before the run); the privacy
  plan decides (:class:`~wasp_vllm.privacy.plan.VoteShape`), the loop votes when the plan says,
  and the ledger refuses any release the plan did not make.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

import numpy as np
import pyarrow as pa

from wasp_vllm.config import ConfigError
from wasp_vllm.pipeline.prompts import Slot
from wasp_vllm.pipeline.selection import plm_weights, select_pools
from wasp_vllm.pipeline.store import stored_embeddings
from wasp_vllm.privacy.voting import NoisyVotes
from wasp_vllm.tasks import TaskSpec


@dataclass(frozen=True, eq=False)
class PolicyContext:
    """What a round policy knows of its run: public settings and the run's own embedder."""

    task: TaskSpec
    #: The run's sentence embedder (``encode(texts) -> float32 rows``), for public text only.
    embedder: Any
    plms: tuple[str, ...]
    #: In-context examples per label the pools should hold (``--s``).
    s: int
    rounds: int
    #: The noise scale of each vote (public; None where the run never votes).
    sigma: float | None


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

    @classmethod
    def of(cls, table: pa.Table, labels: Sequence[str], plms: Sequence[str]) -> VotedSamples:
        """The samples of a run's table (D so far) as a policy sees them."""
        label_of, plm_of = {x: i for i, x in enumerate(labels)}, {p: i for i, p in enumerate(plms)}
        return cls(
            texts=table.column("text").to_pylist(),
            labels=np.array([label_of[x] for x in table.column("label").to_pylist()], dtype=np.int64),
            plms=np.array([plm_of[p] for p in table.column("plm").to_pylist()], dtype=np.int64),
            embeddings=stored_embeddings(table),
            rounds=table.column("round").to_numpy(),
            n_labels=len(labels),
            n_plms=len(plms),
        )


@dataclass(frozen=True, eq=False)
class Vote:
    """One vote as a policy sees it: the round it followed, its noisy histograms, the samples they
    rank, and the run's earlier votes (oldest first; each ranks the first rows of ``samples``, the
    samples written up to its round)."""

    round: int
    votes: NoisyVotes
    samples: VotedSamples
    earlier: tuple[NoisyVotes, ...] = ()


@dataclass(frozen=True, eq=False)
class ChosenPools:
    """Per label index: row indices (into :class:`VotedSamples`) of the good and bad examples."""

    good: dict[int, np.ndarray]
    bad: dict[int, np.ndarray]


class RoundPolicy(Protocol):
    """What a round does with the noisy votes, and which samples it keeps (a frozen dataclass)."""

    #: Recorded with the policy's settings in the run's state and, where it is not the paper's, in
    #: the manifest.
    name: ClassVar[str]

    def pools(self, run: PolicyContext, vote: Vote) -> ChosenPools:
        """Next round's in-context examples: at most ``run.s`` good and bad rows per label."""
        ...

    def plm_weights(self, run: PolicyContext, vote: Vote, previous: np.ndarray) -> np.ndarray:
        """Next round's PLM weights (non-negative, summing to 1) for methods that re-weight."""
        ...

    def reject(self, run: PolicyContext, text: str, slot: Slot) -> str | None:
        """Why a freshly written sample is turned down (it is regenerated), or None to keep it.
        Called after the product's own checks (empty, copy, echo of its prompt or examples),
        before the label check."""
        ...

    def vote_request(self, rounds: int) -> tuple[int, ...] | None:
        """The rounds after which this policy would have the records vote, or None for the paper's
        schedule (after every round but the last). The privacy plan decides; rounds after a round
        without a vote keep the last pools and weights."""
        ...


@dataclass(frozen=True)
class PaperPolicy:
    """The paper's WASP: pools are the top-S of the noisy H_near and H_far per label, PLM weights
    follow each PLM's noisy votes per sample, every sample the product's checks pass is kept."""

    name: ClassVar[str] = "paper"

    def pools(self, run: PolicyContext, vote: Vote) -> ChosenPools:
        samples = vote.samples
        chosen = select_pools(vote.votes.h_near, vote.votes.h_far, samples.labels, run.s, samples.n_labels)
        return ChosenPools(
            good={c: p.good for c, p in chosen.items()}, bad={c: p.bad for c, p in chosen.items()}
        )

    def plm_weights(self, run: PolicyContext, vote: Vote, previous: np.ndarray) -> np.ndarray:
        return plm_weights(vote.votes.h_near, vote.samples.plms, vote.samples.n_plms, previous)

    def reject(self, run: PolicyContext, text: str, slot: Slot) -> str | None:
        return None

    def vote_request(self, rounds: int) -> tuple[int, ...] | None:
        return None


#: The policy of every run that is not handed another one.
DEFAULT_POLICY: RoundPolicy = PaperPolicy()


def check_policy(policy: object) -> None:
    """Refuse a policy that breaks the contract's one checkable part: a frozen dataclass whose
    settings are JSON values (they are recorded for ``--resume``)."""
    params = vars(type(policy)).get("__dataclass_params__")  # the class itself, not a parent
    if params is None or not params.frozen or not isinstance(getattr(policy, "name", None), str):
        raise ConfigError(
            f"round policy {type(policy).__name__} must be a frozen dataclass with a name "
            "(@dataclass(frozen=True); name: ClassVar[str]): a policy keeps no state between rounds"
        )


def policy_identity(policy: RoundPolicy) -> dict[str, Any]:
    """What the run records of its policy and checks on ``--resume``: its name and settings (the
    fields that take part in comparison; a field declared ``compare=False``, such as a test's
    recorder of what the policy was shown, is not a setting)."""
    settings = {f.name: getattr(policy, f.name) for f in dataclasses.fields(policy) if f.compare}  # type: ignore[arg-type]
    return {"name": policy.name, "settings": {k: _plain(v) for k, v in sorted(settings.items())}}


def _plain(value: Any) -> Any:
    """A setting as JSON reads it back (tuples as lists), so a resumed run compares equal."""
    return [_plain(v) for v in value] if isinstance(value, tuple | list) else value
