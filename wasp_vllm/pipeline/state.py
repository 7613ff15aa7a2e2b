"""The state of a run between rounds: typed here, serialised only by the store.

Everything a resumed run needs to continue exactly where a killed one stopped: PLM weights and
which PLMs are still active, the in-context pools chosen from the last noisy votes, the privacy
ledger, one record per finished round, the checksums of the round files and the timings so far.
All of it is public post-processing of the noisy votes, except ``data_fingerprint`` (keyed by the
owner's secret) and ``timings`` of private work: the operator's, never published.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from wasp_vllm.pipeline.selection import allocate_quotas
from wasp_vllm.privacy.accountant import PrivacyLedger


@dataclass(frozen=True)
class Pools:
    """In-context texts per label chosen from the noisy votes (public post-processing)."""

    good: dict[str, list[str]] = field(default_factory=dict)
    bad: dict[str, list[str]] = field(default_factory=dict)


@dataclass(frozen=True)
class RoundRecord:
    """What one round did, per PLM (a row of the manifest's ``rounds``)."""

    round: int
    quotas: dict[str, int]
    weights_before: list[float]
    weights_after: list[float]
    kept: dict[str, int]
    shortfall: dict[str, int]
    tokens: dict[str, int]
    seconds: dict[str, float]
    engine_failures: dict[str, int]
    #: Samples of the round no PLM could write (quotas minus rows): 0 unless engines failed for good
    #: or rejects used up every retry.  The next round's quotas make them up, so the last round's
    #: figure is what the run lacks of N.
    missing: int = 0
    #: Generated samples rejected, per PLM and reason (empty, duplicate, prompt_echo, the gate's,
    #: off_label, unlikely and predictable).
    rejects: dict[str, dict[str, int]] = field(default_factory=dict)
    #: Where the work went: samples each PLM generated (kept or not; ``kept`` + its ``rejects``),
    #: and the tokens of its kept samples (``tokens`` counts all it generated).
    generated: dict[str, int] = field(default_factory=dict)
    kept_tokens: dict[str, int] = field(default_factory=dict)
    #: Kept samples that reached the token cap (max_new_tokens): cut there, likely mid-text.
    capped: dict[str, int] = field(default_factory=dict)


#: The layout of ``state.json``; a state of another format is not resumed (2: the rejected quality
#: levers left the settings, 2026-12, so an older run's settings cannot be rebuilt; 3: the ledger
#: holds the plan's releases and the policy its settings).
STATE_FORMAT = 3


@dataclass
class RunState:
    """Weights, active PLMs, pools, ledger and round records of one run."""

    config_fingerprint: str
    data_fingerprint: str
    noise_key_check: str | None
    plms: list[str]
    weights: list[float]
    ledger: PrivacyLedger
    active: list[str] = field(default_factory=list)
    dropped: dict[str, str] = field(default_factory=dict)
    pools: Pools = field(default_factory=Pools)
    rounds: list[RoundRecord] = field(default_factory=list)
    checksums: dict[str, str] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    #: Share of each label in the samples to write (None: even), from the noisy label histogram.
    label_shares: list[float] | None = None
    #: The round policy that chose the pools and weights, its name and settings
    #: (:func:`wasp_vllm.pipeline.policy.policy_identity`).
    policy: dict[str, Any] = field(default_factory=lambda: {"name": "paper", "settings": {}})
    #: The utility check's noisy confusion matrices (``[sets][K][K]``), once released.
    utility_check: list[list[list[float]]] | None = None
    format: int = STATE_FORMAT

    @property
    def completed_rounds(self) -> int:
        return len(self.rounds)

    def quotas(self, total: int, floor: int, among: list[str] | None = None) -> np.ndarray:
        """``total`` samples over the active PLMs (or those ``among`` them) by weight (equally if
        none has weight)."""
        chosen = self.active if among is None else [p for p in self.active if p in among]
        index = [i for i, p in enumerate(self.plms) if p in chosen]
        quotas = np.zeros(len(self.plms), dtype=np.int64)
        share = np.asarray(self.weights, dtype=float)[index]
        share = share / share.sum() if share.sum() > 0 else np.full(len(index), 1.0 / len(index))
        quotas[index] = allocate_quotas(total, share, floor)
        return quotas

    def drop(self, plm: str, reason: str) -> None:
        """Go on without a PLM that keeps failing; its weight is shared by the others."""
        self.active = [p for p in self.active if p != plm]
        self.dropped[plm] = reason
        self.renormalise()

    def renormalise(self) -> None:
        """Dropped PLMs keep weight 0; the active ones share 1 (equally if none has any weight)."""
        active = np.array([p in self.active for p in self.plms])
        if not active.any():
            return
        weights = np.where(active, np.asarray(self.weights, dtype=float), 0.0)
        if weights.sum() <= 0:
            weights = active / active.sum()
        self.weights = (weights / weights.sum()).tolist()

    # -- serialisation (for the store only) --------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["ledger"] = self.ledger.to_dict()
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunState:
        fields = dict(data)
        fields["ledger"] = PrivacyLedger.from_dict(data["ledger"])
        fields["pools"] = Pools(**data["pools"])
        fields["rounds"] = [RoundRecord(**r) for r in data["rounds"]]
        return cls(**fields)
