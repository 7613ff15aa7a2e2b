"""The prompts of one PLM's share of a round, and the cleaning of what comes back.

Everything here is public: prompts are built from the task file and from synthetic samples in
the pools (chosen by the noisy votes); the private records never enter a prompt.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from wasp_vllm.config import RunConfig
from wasp_vllm.engines import GenerationParams
from wasp_vllm.pipeline.label_check import LabelCheck
from wasp_vllm.pipeline.state import Pools
from wasp_vllm.strategies import PromptKind, Strategy
from wasp_vllm.tasks import TaskSpec, build_prompt, pick_attribute


def request_seed(seed: int, *parts: object) -> int:
    """A 31-bit seed per request, unique per (run seed, round, PLM, slot, attempt).

    Public randomness (sampling of public text): engines take 31-bit seeds.  The DP noise never
    comes from here (see :mod:`wasp_vllm.privacy.secrets`).
    """
    digest = hashlib.blake2b(repr((seed, *parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & 0x7FFFFFFF


def normalize_text(text: str) -> str:
    return " ".join(text.casefold().split())


@dataclass(frozen=True)
class Slot:
    """One sample to be written: its label and attribute, the prompt that asks for it, the
    examples that prompt shows and the PLM asked."""

    index: int
    label: str
    attribute: str | None
    kind: str
    prompt: str
    #: The good (and, in a contrastive prompt, bad) examples the prompt shows.
    good: tuple[str, ...] = ()
    bad: tuple[str, ...] = ()
    plm: str = ""

    @property
    def examples(self) -> tuple[str, ...]:
        return self.good + self.bad


#: ``gate(text, slot) -> reason or None``: the round policy's own check of a sample
#: (:meth:`wasp_vllm.pipeline.policy.RoundPolicy.reject`), after the product's.
Gate = Callable[[str, Slot], str | None]


@dataclass(frozen=True)
class RoundInputs:
    """What every PLM of round ``t`` shares: settings, method, task, pools, texts already in D."""

    cfg: RunConfig
    strategy: Strategy
    task: TaskSpec
    pools: Pools
    t: int
    seen: frozenset[str]
    params: GenerationParams
    gate: Gate | None = None
    #: Share of each label in the samples to write (None: even), from a noisy private histogram.
    label_shares: tuple[float, ...] | None = None
    #: Off-label samples are rejected too (``--label-check drop``); None: no label check.
    label_check: LabelCheck | None = None


@dataclass(frozen=True)
class Share:
    """One PLM's part of a round; ``part`` > 0 marks a reassigned share of a failed PLM."""

    k: int
    quota: int
    part: int = 0


def make_slots(rin: RoundInputs, share: Share, labels: Sequence[str], attempt: int) -> list[Slot]:
    """One prompt per wanted label: zero-shot until the pools fill, then the strategy's prompt."""
    cfg, task, pools, strategy = rin.cfg, rin.task, rin.pools, rin.strategy
    plm = cfg.plms[share.k]
    rng = np.random.default_rng([cfg.seed, rin.t, share.k, share.part, attempt, 17])
    shared_sets = cfg.example_sets if strategy.shares_draws else 0
    drawn: dict[tuple[str, int], tuple[list[str], list[str]]] = {}
    per_label: Counter[str] = Counter()
    slots = []
    for i, label in enumerate(labels):
        attribute = pick_attribute(task, label, rng)
        good_pool, bad_pool = pools.good.get(label, []), pools.bad.get(label, [])
        kind = strategy.prompt_kind(rin.t, bool(good_pool))
        good: list[str] = []
        bad: list[str] = []
        if kind is not PromptKind.ZERO_SHOT:
            # Prompts of one label reuse a few example draws (the examples open the prompt, so
            # the prefix cache prefills each draw once); otherwise every prompt draws afresh.
            key = (label, per_label[label] % shared_sets if shared_sets else per_label[label])
            per_label[label] += 1
            if key not in drawn:
                drawn[key] = strategy.draw_examples(kind, good_pool, bad_pool, cfg.s, rng)
            good, bad = drawn[key]
        prompt = build_prompt(task, kind.value, label, attribute, good=good, bad=bad)
        shown = tuple(map(str, good)), tuple(map(str, bad))  # plain text, not NumPy's
        slots.append(Slot(i, label, attribute, kind.value, prompt, *shown, plm))
    return slots


def clean_sample(
    text: str, slot: Slot, gate: Gate | None, *seen: set[str] | frozenset[str]
) -> tuple[str | None, str | None]:
    """``(sample, None)``, or ``(None, reason)`` for a sample that is empty, a copy of one already
    kept, an echo of its prompt, or one the ``gate`` (the round policy's check) turns down."""
    text = text.strip().strip('"').strip()
    key = normalize_text(text)
    if len(key) < 3:
        return None, "empty"
    if any(key in s for s in seen):
        return None, "duplicate"
    if any(key == normalize_text(e) for e in slot.examples) or key in normalize_text(slot.prompt):
        return None, "prompt_echo"
    reason = gate(text, slot) if gate is not None else None
    return (None, reason) if reason else (text, None)
