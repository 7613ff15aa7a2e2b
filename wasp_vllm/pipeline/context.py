"""Everything a run knows before its first round: settings, method, task, the records that vote,
and the privacy plan (sigma) fixed before any private data is touched."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from wasp_vllm.config import ConfigError, RunConfig
from wasp_vllm.data.records import (
    Columns,
    PrivateSet,
    draw_records,
    load_private,
    table_to_set,
    with_parties,
)
from wasp_vllm.pipeline.selection import allocate_quotas
from wasp_vllm.privacy.accountant import PrivacyUnit
from wasp_vllm.privacy.plan import PrivacyPlan, plan_privacy
from wasp_vllm.privacy.sampling import voting_neighbour
from wasp_vllm.strategies import Strategy, get_strategy
from wasp_vllm.tasks import TaskSpec, get_task


@dataclass
class RunContext:
    cfg: RunConfig
    strategy: Strategy
    task: TaskSpec
    private: PrivateSet
    plan: PrivacyPlan


def prepare(
    cfg: RunConfig, *, check_models: bool = False, private_table: pa.Table | None = None
) -> RunContext:
    """Load the task and the private data, draw the records that vote, plan the privacy spending.

    ``private_table`` holds in-memory private data (the Python API), read instead of
    ``cfg.private``.  ``check_models`` also resolves every PLM and the embedder (loading none), so
    that a wrong name fails before any engine starts; callers with their own engines skip it.
    """
    task = get_task(cfg.task)
    strategy = get_strategy(cfg.strategy).for_run(cfg.later_prompt)
    columns = Columns(cfg.text_col, cfg.label_col, cfg.attribute_col, cfg.user_col)
    if private_table is not None:
        private = table_to_set(private_table, task, "the private data", columns)
    else:
        private = load_private(cfg.private, task, columns, seed=cfg.seed)
    if cfg.parties is not None:
        private = with_parties(private, cfg.parties, cfg.dirichlet, cfg.seed)
    cap = cfg.max_records_per_user if cfg.privacy_unit == "user" else None
    if cap is not None and private.users is None and private.parties is None:
        raise ConfigError("--privacy-unit user needs --user-col (or --parties, one user per party)")
    private = draw_records(private, cfg.private_limit, cfg.seed, cap)
    validate_against_data(cfg, strategy, task, private)
    if check_models:
        from wasp_vllm.engines.embedder import resolve_embedder
        from wasp_vllm.engines.registry import check_plms

        check_plms(cfg.plms, cfg.engine)
        resolve_embedder(cfg.embedder)
    return RunContext(cfg, strategy, task, private, privacy_plan(cfg))


def votes(cfg: RunConfig) -> bool:
    """Whether the private records vote in this run (never with one round: the last never votes)."""
    return get_strategy(cfg.strategy).votes and cfg.rounds > 1


def privacy_plan(cfg: RunConfig) -> PrivacyPlan:
    """Sigma for the records that vote: a ``--m`` draw makes their relation *replace*, a user cap
    multiplies the sensitivity by ``k`` (see :mod:`wasp_vllm.privacy.sampling`)."""
    privacy = cfg.privacy
    return plan_privacy(
        privacy.epsilon,
        privacy.delta,
        cfg.rounds if votes(cfg) else 1,
        get_strategy(cfg.strategy).q(cfg.q),
        mode=privacy.accountant,
        unit=PrivacyUnit(
            voting_neighbour(privacy.neighbour, selected=cfg.private_limit is not None),
            privacy.records_per_unit,
        ),
        prior_share=privacy.label_prior_share if cfg.label_prior == "private" else 0.0,
        histograms=2 if cfg.far_votes == "on" else 1,
    )


def neighbourhood(cfg: RunConfig) -> dict[str, Any]:
    """What the guarantee is about, in words and numbers (all public settings)."""
    unit = "user" if cfg.privacy_unit == "user" else "record"
    selected = cfg.private_limit is not None
    return {
        "unit": unit,
        "input_file": f"{cfg.neighbour}: one {unit} of the file passed with --private",
        "max_records_per_unit": cfg.privacy.records_per_unit,
        "bounding": "each user keeps at most k records, chosen by a keyed hash among its own records"
        if unit == "user"
        else None,
        "selection": f"the M={cfg.private_limit} records of smallest keyed hash (public seed)"
        if selected
        else "every record of the file",
        "voting_set": voting_neighbour(cfg.neighbour, selected).value,
        "why": "a draw of M by keyed hash turns one unit more or less in the file into at most k "
        "records swapped among those that vote"
        if selected
        else "the records that vote are the file's records",
    }


def validate_against_data(cfg: RunConfig, strategy: Strategy, task: TaskSpec, private: PrivateSet) -> None:
    """Checks that need the task and the private set; messages state no private count."""
    n_labels = len(task.labels)
    if cfg.n < len(cfg.plms) * n_labels:
        raise ConfigError(
            f"n={cfg.n} is too small: every PLM needs at least one sample per label "
            f"({len(cfg.plms)} PLMs x {n_labels} labels = {len(cfg.plms) * n_labels})"
        )
    if not votes(cfg):
        return
    q = strategy.q(cfg.q)
    # Decided on the public --m, never on how many records the file holds: an abort exactly when
    # fewer than q records vote would publish that fact.  With fewer voters than q a run still
    # votes (each record's Top-q is over synthetic samples); it is just less useful.
    if cfg.private_limit is not None and cfg.private_limit < q:
        raise ConfigError(
            f"--m {cfg.private_limit} draws fewer records than q={q}: use a larger --m or a smaller --q"
        )
    per_label_round = cfg.n // cfg.rounds // n_labels
    if cfg.s > max(1, per_label_round * (cfg.rounds - 1)):
        raise ConfigError(
            f"s={cfg.s} is larger than any pool can be (about {per_label_round} samples per label per round)"
        )


def per_round_totals(n: int, rounds: int) -> np.ndarray:
    """``n`` samples split evenly over the rounds (largest remainder)."""
    return allocate_quotas(n, np.full(rounds, 1.0 / rounds))
