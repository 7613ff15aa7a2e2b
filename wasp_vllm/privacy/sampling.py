"""Which private records take part in a run: every rule here looks at one record (or one unit) alone.

The guarantee is with respect to the file the user passes.  A rule that compares records with
each other (per-label quotas from exact label counts, ``rng.choice`` over positions) lets one
record more or less in the file move many others in or out of the selected set, which no
accountant covers.  So:

* :func:`bound_contributions` keeps at most ``k`` records of each unit (user, or party when the
  parties are the units), chosen by a keyed hash of the record among that unit's records only:
  one unit's records never change what another unit keeps.
* :func:`select_top_m` keeps the ``m`` records with the smallest keyed hash.  Adding or removing
  one record of the file changes the kept set by at most one record out and one record in (the
  new record displaces the m-th, or a removed one is replaced by the (m+1)-th); with the cap, a
  unit's change moves at most ``k`` out and ``k`` in.  The vote vectors of different records are
  non-negative, so that move has L2 norm at most ``sqrt(2) * k`` times one record's: the
  accountant's *replace* sensitivity (:func:`voting_neighbour`).
* :func:`assign_parties` puts each record in a federated party by its label and its own hash,
  against per-label Dirichlet shares drawn from the public seed, so one record more or less
  changes no other record's party.

The hashes are keyed with the public run seed: a rule that is fixed before the data is seen needs
no secret, and ``evaluate --m`` can reproduce the draw.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

import numpy as np

from wasp_vllm.privacy.accountant import Neighbour
from wasp_vllm.privacy.secrets import record_uniform


def _order(records: Sequence[bytes], indices: Sequence[int], purpose: str, seed: int) -> list[int]:
    """``indices`` by ascending keyed hash of their records; identical records by position."""
    return sorted(indices, key=lambda i: (record_uniform(records[i], purpose, seed), i))


def select_top_m(records: Sequence[bytes], m: int, seed: int) -> np.ndarray:
    """Sorted indices of the ``m`` records with the smallest keyed hash (all of them if fewer)."""
    if m < 1:
        raise ValueError(f"m must be a positive number of records, got {m}")
    kept = _order(records, range(len(records)), "select", seed)[:m]
    return np.sort(np.asarray(kept, dtype=np.int64))


def bound_contributions(records: Sequence[bytes], units: Sequence[object], k: int, seed: int) -> np.ndarray:
    """Sorted indices keeping at most ``k`` records per unit, by each unit's own keyed-hash order."""
    if k < 1:
        raise ValueError(f"the cap on records per unit must be >= 1, got {k}")
    if len(units) != len(records):
        raise ValueError("one unit id per record is needed")
    members: dict[str, list[int]] = defaultdict(list)
    for i, unit in enumerate(units):
        members[str(unit)].append(i)
    kept = [i for idx in members.values() for i in _order(records, idx, "bound", seed)[:k]]
    return np.sort(np.asarray(kept, dtype=np.int64))


def assign_parties(
    records: Sequence[bytes], labels: np.ndarray, n_labels: int, n_parties: int, alpha: float, seed: int
) -> np.ndarray:
    """A party id per record: label-skewed (non-IID) by Dirichlet(``alpha``) shares per label.

    Small ``alpha`` concentrates each label on few parties, large ``alpha`` is close to IID.  A
    party may hold no record; it still takes part in the federated vote (and adds its noise).
    """
    if n_parties < 1:
        raise ValueError(f"the number of parties must be >= 1, got {n_parties}")
    if not alpha > 0:
        raise ValueError(f"the Dirichlet alpha must be > 0, got {alpha}")
    labels = np.asarray(labels, dtype=np.int64)
    if labels.shape != (len(records),):
        raise ValueError("one label per record is needed")
    shares = np.random.default_rng([seed, 0x50415254]).dirichlet(np.full(n_parties, alpha), size=n_labels)
    edges = np.cumsum(shares, axis=1)
    parties = np.empty(len(records), dtype=np.int64)
    for i, record in enumerate(records):
        u = record_uniform(record, "party", seed)
        parties[i] = min(int(np.searchsorted(edges[labels[i]], u, side="right")), n_parties - 1)
    return parties


def voting_neighbour(file_neighbour: Neighbour | str, selected: bool) -> Neighbour:
    """The neighbour relation the accountant must assume for the records that vote.

    A ``--m`` draw (``selected``) turns one unit more or less in the file into at most a swap of
    records in the kept set, so its relation is *replace* whatever the file's relation is.
    """
    file_neighbour = Neighbour(file_neighbour)
    return Neighbour.REPLACE if selected else file_neighbour
