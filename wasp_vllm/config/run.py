"""The configuration of one run: the roles composed, checked together, and fingerprinted.

``RunConfig`` is validated by pydantic and loadable from a TOML or YAML run file (flat: one key
per setting); the ``generate`` command builds one command-line option per field from it (name,
help, default, panel), so a setting, its default and its help live in its role and nowhere else.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, get_args

from pydantic import ConfigDict, model_validator

from wasp_vllm.config.fields import ConfigError, build_settings
from wasp_vllm.config.roles import (
    DataSettings,
    EngineArgs,
    EngineSettings,
    LaterPrompt,
    MethodSettings,
    PrivacySettings,
    SamplingSettings,
    WhatSettings,
)
from wasp_vllm.strategies import STRATEGIES, get_strategy
from wasp_vllm.tasks.spec import PromptKind


# pydantic lists the fields of several bases last base first: this order shows `--help` and the
# schema in reading order (what, data, privacy, method, sampling, engines).
class RunConfig(
    EngineSettings, SamplingSettings, MethodSettings, PrivacySettings, DataSettings, WhatSettings
):
    """Everything that decides what a run generates and what privacy it spends: one value per role,
    composed (a run file and the command line stay flat: ``epsilon = 4``, ``--epsilon 4``)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    @property
    def what(self) -> WhatSettings:
        return WhatSettings.of(self)

    @property
    def data(self) -> DataSettings:
        return DataSettings.of(self)

    @property
    def privacy(self) -> PrivacySettings:
        return PrivacySettings.of(self)

    @property
    def method(self) -> MethodSettings:
        return MethodSettings.of(self)

    @property
    def sampling(self) -> SamplingSettings:
        return SamplingSettings.of(self)

    @property
    def engines(self) -> EngineSettings:
        return EngineSettings.of(self)

    @model_validator(mode="before")
    @classmethod
    def _resolve_later_prompt(cls, data: Any) -> Any:
        """'auto' becomes the method's prompt here, so the manifest and resume see what ran."""
        if not isinstance(data, dict):
            return data
        strategy = data.get("strategy", cls.model_fields["strategy"].default)
        if strategy not in STRATEGIES:
            return data  # the field's own check names the unknown method
        asked = data.get("later_prompt", "auto")
        if asked not in get_args(LaterPrompt):
            return data  # the field's own check lists the choices
        return {**data, "later_prompt": get_strategy(strategy).resolve_later_prompt(asked).value}

    @model_validator(mode="before")
    @classmethod
    def _resolve_far_votes(cls, data: Any) -> Any:
        """'auto' becomes 'on' where the prompts after round 0 show the far pool (contrastive), else
        'off': a histogram no step uses is neither released nor paid for."""
        default = cls.model_fields["far_votes"].default
        if not isinstance(data, dict) or data.get("far_votes", default) != "auto":
            return data
        strategy = data.get("strategy", cls.model_fields["strategy"].default)
        try:
            later = get_strategy(strategy).resolve_later_prompt(data.get("later_prompt", "auto"))
        except ValueError:
            return data  # the other checks name the unknown method or the prompt it cannot take
        return {**data, "far_votes": "on" if later is PromptKind.CONTRASTIVE else "off"}

    @model_validator(mode="after")
    def _consistent(self) -> RunConfig:
        if self.parties is not None and self.tolerance >= self.parties:
            raise ValueError("tolerance must be smaller than the number of parties")
        problem = get_strategy(self.strategy).problem(len(self.plms), self.parties)
        if problem:
            raise ValueError(problem)
        if self.n < self.rounds:
            raise ValueError(f"n={self.n} is smaller than rounds={self.rounds}")
        if self.label_prior == "private" and self.accountant != "exact":
            raise ValueError("label_prior=private needs the exact accountant (it splits the budget in mu^2)")
        if self.label_prior == "private" and self.parties is not None:
            # The prior's histogram would pool every party's exact labels on the server, which the
            # federated guarantee (secure aggregation reveals only noisy sums) rules out.
            raise ValueError(
                "label_prior=private cannot be used with parties: it would pool the parties' exact "
                "labels in one place; use label_prior=uniform (the default) with --parties"
            )
        if self.utility_check_share > 0 and (self.accountant != "exact" or self.parties is not None):
            raise ValueError(
                "utility_check_share needs the exact accountant (it splits the budget in mu^2) and no "
                "parties (its confusion matrices would pool the parties' exact labels in one place)"
            )
        if self.publish_better and self.utility_check_share == 0:
            raise ValueError(
                "publish_better decides from the utility check: set utility_check_share too "
                "(--utility-check-share 0.1)"
            )
        if self.privacy_unit == "user" and self.max_records_per_user is None:
            raise ValueError(
                "privacy_unit=user needs max_records_per_user (--max-records-per-user k): a public cap, "
                "not the data's own maximum, which would itself be private"
            )
        return self

    @model_validator(mode="after")
    def _far_votes_used(self) -> RunConfig:
        if self.far_votes == "off" and self.later_prompt == PromptKind.CONTRASTIVE.value:
            raise ValueError(
                "far_votes=off: contrastive prompts show the far pool, which needs H_far; use "
                "far_votes=on (or auto), or later_prompt=few_shot"
            )
        return self

    def fingerprint(self) -> str:
        """Hash of the settings that decide the output (resume refuses a different one).

        The noise seed stays out: a hash over it would let anyone brute-force a small one (the
        noise key is checked on resume by its own keyed check value).
        """
        keep = self.model_dump(mode="json")
        for volatile in VOLATILE:
            keep.pop(volatile)
        for volatile in VOLATILE_ENGINE_ARGS:
            keep["engine_args"].pop(volatile)
        return hashlib.sha256(json.dumps(keep, sort_keys=True).encode()).hexdigest()[:16]


#: Settings a resumed run may change: the noise seed (above) and the licence, which only the card
#: states; and the engine arguments that decide how fast, not what.
VOLATILE = ("noise_seed", "license")
VOLATILE_ENGINE_ARGS = ("engine_retries", "concurrent", "batch_size", "cpu_kv_cache_gib", "sleep_mode")
#: Settings that became engine arguments (2026-12): a run file or a keyword that still sets one at
#: the top level is told where it went.
MOVED_TO_ENGINE_ARGS = frozenset(EngineArgs.model_fields)


#: Settings that were measured, not adopted and removed (2026-12): a run file that still sets one is
#: told where they went, not just that the name is unknown.
REMOVED = frozenset({
    "quality_gate", "min_sample_logprob", "max_sample_logprob", "vote_cluster_size", "pool_per_cluster",
    "pool_label_filter", "pool_far_filter", "voted_samples", "plm_weighting", "final_vote",
    "label_prior_smoothing", "label_prior_floor", "few_shot_examples", "zero_shot_share", "prompt_style",
    "label_check_margin",
})  # fmt: skip


def build_config(file_values: dict[str, Any], overrides: dict[str, Any]) -> RunConfig:
    """Merge file settings with command-line overrides and validate the result."""
    gone = sorted(REMOVED & (set(file_values) | set(overrides)))
    if gone:
        raise ConfigError(
            f"{', '.join(gone)}: measured, not adopted and removed from wasp-vllm "
            "(docs/research/levers-not-adopted.md; the last version with it is commit f7b6f4b); "
            "leave it out"
        )
    moved = sorted(MOVED_TO_ENGINE_ARGS & (set(file_values) | set(overrides)))
    if moved:
        example = moved[0]
        raise ConfigError(
            f"{', '.join(moved)}: now an engine argument: --engine-arg {example}=VALUE on the command "
            f"line, {example} = ... under [engine_args] in a run file, engine_args={{{example!r}: ...}} "
            "from Python"
        )
    merged = {**file_values, **{k: v for k, v in overrides.items() if v is not None}}
    return build_settings(RunConfig, merged)
