"""The voting mechanisms: the only code that reads the private records, behind one interface.

``release(round, synthetic embeddings, synthetic labels) -> NoisyVotes`` (and, once the rounds are
done, ``release_confusions``: the utility check).  A mechanism owns what
a release needs: the private embeddings and labels, the noise scale of the plan, the run's
secret (each mechanism derives its own noise streams from it) and the ledger, on which it
records the release *before* computing anything, so a release over the budget never happens.
Only the noisy histograms leave :meth:`VotingMechanism.release`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence

import numpy as np

from wasp_vllm.privacy.accountant import PrivacyLedger
from wasp_vllm.privacy.federated import SecureAggregation, federated_noisy_votes
from wasp_vllm.privacy.plan import UTILITY_MATRICES, PrivacyPlan
from wasp_vllm.privacy.secrets import RunSecret
from wasp_vllm.privacy.voting import NoisyVotes, Voters, noisy_votes

#: A public task model, applied to the private records' embeddings: label indices, one per row.
Classifier = Callable[[np.ndarray], np.ndarray]


class VotingMechanism(ABC):
    """A Gaussian release of the per-round vote histograms."""

    def __init__(self, voters: Voters, q: int, plan: PrivacyPlan, secret: RunSecret, ledger: PrivacyLedger):
        """A mechanism for ``voters`` that releases what ``plan`` paid for, charging ``ledger``."""
        if plan.sigma is None:
            raise ValueError("a voting mechanism needs a plan with voting rounds")
        self.voters, self.q, self.plan, self.secret, self.ledger = voters, q, plan, secret, ledger
        self.sigma: float = plan.sigma
        self.far: bool = plan.histograms == 2  # H_far is released only where the plan pays for it

    def release(self, round_index: int, synth_emb: np.ndarray, synth_labels: np.ndarray) -> NoisyVotes:
        """Charge the ledger, then compute and noise the votes of round ``round_index``."""
        self.ledger.record(self.plan.release(round_index))
        return self._noisy_votes(round_index, synth_emb, synth_labels)

    @abstractmethod
    def _noisy_votes(
        self, round_index: int, synth_emb: np.ndarray, synth_labels: np.ndarray
    ) -> NoisyVotes: ...

    def release_confusions(self, classifiers: Sequence[Classifier], n_labels: int) -> np.ndarray:
        """The utility check: each public classifier (trained on public samples only) labels the
        voting records; one ``[K, K]`` confusion matrix per classifier (rows: true label), noised
        with the plan's utility sigma, charged on the ledger first.  Each record adds one count to
        each matrix, so the plan's sensitivity counts the matrices: exactly these many."""
        if len(classifiers) != UTILITY_MATRICES:
            raise ValueError(f"the utility check's sensitivity is planned for {UTILITY_MATRICES} matrices")
        self.ledger.record(self.plan.utility_release())
        v = self.voters
        clean = np.stack(
            [clean_confusion(v.labels, np.asarray(c(v.embeddings)), n_labels) for c in classifiers]
        )
        noise = self.secret.generator("utility-check").normal(
            0.0, float(self.plan.utility_sigma or 0.0), clean.shape
        )
        return clean + noise


class CentralVoting(VotingMechanism):
    """One curator holds every record: clean histograms plus ``N(0, sigma^2)`` per bin."""

    def _noisy_votes(self, round_index: int, synth_emb: np.ndarray, synth_labels: np.ndarray) -> NoisyVotes:
        rng = self.secret.generator("vote", round_index)
        v = self.voters
        return noisy_votes(v.embeddings, v.labels, synth_emb, synth_labels, self.q, self.sigma, rng, self.far)


class FederatedVoting(VotingMechanism):
    """Records at ``n_parties`` parties: local votes and noise shares, summed by secure aggregation."""

    def __init__(self, voters: Voters, q: int, plan: PrivacyPlan, secret: RunSecret, ledger: PrivacyLedger,
                 *, n_parties: int, tolerance: int) -> None:  # fmt: skip
        if voters.parties is None:
            raise ValueError("federated voting needs a party per record")
        super().__init__(voters, q, plan, secret, ledger)
        self.parties: np.ndarray = voters.parties
        self.n_parties, self.tolerance = n_parties, tolerance

    def release_confusions(self, classifiers: Sequence[Classifier], n_labels: int) -> np.ndarray:
        """Refused: a confusion matrix would pool the parties' exact labels in one place."""
        raise ValueError("the utility check cannot be made with parties (it would pool their labels)")

    def _noisy_votes(self, round_index: int, synth_emb: np.ndarray, synth_labels: np.ndarray) -> NoisyVotes:
        v, secret = self.voters, self.secret
        votes, _ = federated_noisy_votes(
            v,
            synth_emb,
            synth_labels,
            self.q,
            self.sigma,
            noise=lambda party: secret.generator("federated-vote", round_index, party),
            protocol=SecureAggregation(self.plan.mode, self.tolerance, self.n_parties, far=self.far),
        )
        return votes


def open_voting(voters: Voters, q: int, plan: PrivacyPlan, secret: RunSecret, ledger: PrivacyLedger,
                *, n_parties: int | None, tolerance: int = 0) -> VotingMechanism:  # fmt: skip
    """The mechanism the voters call for: secure aggregation among the parties when each record has
    one (``n_parties`` of them, ``tolerance`` of which may collude or drop), else central voting."""
    if voters.parties is not None:
        if n_parties is None:
            raise ValueError("records with parties need the number of parties")
        return FederatedVoting(voters, q, plan, secret, ledger, n_parties=n_parties, tolerance=tolerance)
    return CentralVoting(voters, q, plan, secret, ledger)


def release_label_histogram(
    labels: np.ndarray, n_labels: int, plan: PrivacyPlan, secret: RunSecret, ledger: PrivacyLedger
) -> np.ndarray:
    """Noisy count of the private records per label: a Gaussian release charged on the ledger first."""
    ledger.record(plan.prior_release())
    counts = clean_label_counts(labels, n_labels)
    return counts + secret.generator("label-prior").normal(0.0, float(plan.prior_sigma or 0.0), n_labels)


def clean_label_counts(labels: np.ndarray, n_labels: int) -> np.ndarray:
    """Exact count of the private records per label: never leaves this module without noise."""
    return np.bincount(np.asarray(labels, dtype=np.int64), minlength=n_labels).astype(np.float64)


def clean_confusion(labels: np.ndarray, predicted: np.ndarray, n_labels: int) -> np.ndarray:
    """Exact confusion counts of the private records: never leaves this module without noise."""
    cells = np.asarray(labels, dtype=np.int64) * n_labels + np.asarray(predicted, dtype=np.int64)
    return np.bincount(cells, minlength=n_labels * n_labels).reshape(n_labels, n_labels).astype(np.float64)
