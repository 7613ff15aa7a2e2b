"""What each method is: WASP, its ablations and the baselines, as values of one registry.

A strategy states everything the round loop asks of a method: whether the private records vote
(and with how many nearest/furthest samples), which prompt a PLM gets after round 0, how its
in-context examples are drawn, and whether PLM weights follow the votes.  The loop never asks
which method it runs; adding a method is one entry in :data:`STRATEGIES`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from wasp_vllm.tasks import draw_contrastive_examples
from wasp_vllm.tasks.spec import PromptKind

#: What ``--later-prompt auto`` means for the WASP family (whose prompt after round 0 can be either):
#: few-shot, chosen on the validation splits of four built-in tasks (README, "Quality levers":
#: better on the mean, worse beyond the paired std on none); ``contrastive`` is the paper's.
AUTO_LATER_PROMPT = PromptKind.FEW_SHOT


@dataclass(frozen=True)
class Strategy:
    """One method, as the round loop sees it."""

    name: str
    summary: str
    #: Private records vote in every round but the last (False: the run never reads them).
    votes: bool = True
    #: Nearest and furthest samples each private record votes for; None: the run's ``--q``.
    top_q: int | None = None
    #: Prompt after round 0, once the votes have filled the pools.
    later_prompt: PromptKind = PromptKind.CONTRASTIVE
    #: Good examples in a few-shot prompt; None: the run's ``--s``.
    few_shot_examples: int | None = None
    #: Prompts of one label, PLM and round share ``example_sets`` draws, so vLLM's prefix cache
    #: prefills each draw once (most of a contrastive round's time is prefill).
    shares_draws: bool = False
    #: Each PLM's share of the next round follows the votes its samples got.
    reweights: bool = False
    #: The method runs exactly one PLM (Private Evolution's single API).
    one_plm: bool = False
    #: The method is federated: the private records sit with ``--parties`` data parties.
    needs_parties: bool = False

    def q(self, run_q: int) -> int:
        return self.top_q if self.top_q is not None else run_q

    @property
    def chooses_later_prompt(self) -> bool:
        """Whether the run chooses this method's prompt after round 0 (``--later-prompt``): WASP and
        its ablations, whose pools hold S good and S bad examples of each label."""
        return self.votes and self.few_shot_examples is None and self.later_prompt is not PromptKind.ZERO_SHOT

    def resolve_later_prompt(self, asked: str) -> PromptKind:
        """``--later-prompt``'s value for this method: 'auto' is the method's own choice (for WASP,
        :data:`AUTO_LATER_PROMPT` unless the method is the few-shot ablation)."""
        if asked == "auto":
            own_choice = self.chooses_later_prompt and self.later_prompt is PromptKind.CONTRASTIVE
            return AUTO_LATER_PROMPT if own_choice else self.later_prompt
        kind = PromptKind(asked)
        if kind is not self.later_prompt and not self.chooses_later_prompt:
            raise ValueError(f"{self.name} always uses {self.later_prompt.value} prompts after round 0")
        return kind

    def for_run(self, later_prompt: str) -> Strategy:
        """This method with the run's (resolved) prompt after round 0."""
        return replace(self, later_prompt=PromptKind(later_prompt))

    def prompt_kind(self, round_index: int, has_pool: bool) -> PromptKind:
        """Zero-shot until the votes have filled this label's pool, then the method's prompt."""
        if round_index == 0 or not has_pool or not self.votes:
            return PromptKind.ZERO_SHOT
        return self.later_prompt

    def draw_examples(
        self, kind: PromptKind, good: Sequence[str], bad: Sequence[str], s: int, rng: np.random.Generator
    ) -> tuple[list[str], list[str]]:
        """In-context examples for one prompt: a fresh random subset of the selected pools."""
        if kind is PromptKind.CONTRASTIVE:
            return draw_contrastive_examples(good, bad, s, rng)
        n_good = self.few_shot_examples if self.few_shot_examples is not None else s
        return list(rng.choice(good, size=min(n_good, len(good)), replace=False)), []

    def problem(self, n_plms: int, parties: int | None) -> str | None:
        """Why these settings cannot run this method, or None."""
        if self.one_plm and n_plms != 1:
            return f"{self.name} uses exactly one PLM; pass a single --plms name"
        if self.needs_parties and parties is None:
            return f"the {self.name} strategy is federated: set parties (--parties L)"
        return None


STRATEGIES: dict[str, Strategy] = {
    s.name: s
    for s in [
        Strategy(
            "wasp",
            "WASP: in-context examples from the votes (few-shot by default; the paper's contrastive "
            "good and bad pools with --later-prompt contrastive); PLM weights follow the votes",
            shares_draws=True,
            reweights=True,
        ),
        Strategy(
            "wasp-no-contrast",
            "WASP ablation: few-shot prompts from the good pool only, whatever --later-prompt says",
            later_prompt=PromptKind.FEW_SHOT,
            shares_draws=True,
            reweights=True,
        ),
        Strategy(
            "wasp-no-weighting",
            "WASP ablation: every PLM keeps an equal share",
            shares_draws=True,
        ),
        Strategy(
            "aug-pe",
            "Aug-PE (Private Evolution): one PLM, Top-1 votes, variations of one voted sample",
            top_q=1,
            later_prompt=PromptKind.FEW_SHOT,
            few_shot_examples=1,
            one_plm=True,
        ),
        Strategy(
            "pre-text",
            "Pre-Text: federated Private Evolution (Top-1 votes at each party), PLMs at equal shares",
            top_q=1,
            later_prompt=PromptKind.FEW_SHOT,
            few_shot_examples=1,
            needs_parties=True,
        ),
        Strategy(
            "fusegen",
            "FuseGen: every PLM writes zero-shot; the private records are never read",
            votes=False,
            later_prompt=PromptKind.ZERO_SHOT,
        ),
    ]
}


def get_strategy(name: str) -> Strategy:
    try:
        return STRATEGIES[name]
    except KeyError:
        raise ValueError(f"unknown strategy {name!r}; one of {', '.join(STRATEGIES)}") from None
