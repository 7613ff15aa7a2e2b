"""Everything a run knows before its first round: settings, method, task, the records that vote,
and the privacy plan (sigma) fixed before any private data is touched."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

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
from wasp_vllm.pipeline.policy import DEFAULT_POLICY, RoundPolicy, check_policy
from wasp_vllm.pipeline.selection import allocate_quotas
from wasp_vllm.privacy.accountant import PrivacyUnit
from wasp_vllm.privacy.plan import BudgetShares, PrivacyPlan, VoteShape, plan_privacy
from wasp_vllm.privacy.report import Neighbourhood
from wasp_vllm.privacy.sampling import voting_neighbour
from wasp_vllm.privacy.secrets import RecordKeys, owner_key
from wasp_vllm.strategies import Strategy, get_strategy
from wasp_vllm.tasks import TaskSpec, get_task

log = logging.getLogger(__name__)


@dataclass
class RunContext:
    cfg: RunConfig
    strategy: Strategy
    task: TaskSpec
    private: PrivateSet
    plan: PrivacyPlan
    #: What each round does with its noisy votes; ``plan`` is made for the votes it asks for.
    policy: RoundPolicy = DEFAULT_POLICY
    #: Keyed hashes of every text of the private data passed (before any draw): the operator's.
    record_keys: RecordKeys | None = None


def prepare(
    cfg: RunConfig,
    *,
    check_models: bool = False,
    private_table: pa.Table | None = None,
    policy: RoundPolicy = DEFAULT_POLICY,
) -> RunContext:
    """Load the task and the private data, draw the records that vote, plan the privacy spending.

    ``private_table`` holds in-memory private data (the Python API), read instead of
    ``cfg.private``.  ``check_models`` also resolves every PLM and the embedder (loading none), so
    that a wrong name fails before any engine starts; callers with their own engines skip it.
    ``policy``: the round policy the run will follow (the benchmark harness's experiments); the
    plan's schedule and sigma are made for the votes it asks for (:meth:`RoundPolicy.vote_request`).
    The settings are checked first (:func:`check_run`, the dry run's check too), before any
    private record is read.
    """
    check_policy(policy)
    task = check_run(cfg, private_given=private_table is not None)
    strategy = get_strategy(cfg.strategy).for_run(cfg.later_prompt)
    columns = Columns(cfg.text_col, cfg.label_col, cfg.attribute_col, cfg.user_col)
    if private_table is not None:
        private = table_to_set(private_table, task, "the private data", columns)
    else:
        private = load_private(cfg.private, task, columns, seed=cfg.seed)
    keys = RecordKeys.of(private.texts, owner_key())  # every record of the data, drawn or not
    if cfg.parties is not None:
        private = with_parties(private, cfg.parties, cfg.dirichlet, cfg.seed)
    cap = cfg.max_records_per_user if cfg.privacy_unit == "user" else None
    if cap is not None and private.users is None and private.parties is None:
        raise ConfigError("--privacy-unit user needs --user-col (or --parties, one user per party)")
    private = draw_records(private, cfg.private_limit, cfg.seed, cap)
    if check_models:
        check_run_models(cfg, dequantize=True)
    return RunContext(cfg, strategy, task, private, privacy_plan(cfg, policy), policy, keys)


def check_run(cfg: RunConfig, *, private_given: bool = False) -> TaskSpec:
    """Every check of a run's settings that needs no private record and no model: the one check
    that ``generate`` and ``generate --dry-run`` (``api.plan``) both make, so a plan that prints is
    a run that starts.  Each problem is named, all in one ConfigError; returns the task.

    ``private_given``: the records come from memory (the Python API), not from ``cfg.private``."""
    task = get_task(cfg.task)
    problems = [p for p in (*_size_problems(cfg, task), _private_problem(cfg, private_given)) if p]
    if problems:
        raise ConfigError("; ".join(problems))
    if warning := large_epsilon(cfg.epsilon):
        log.warning(warning)
    return task


#: Above this epsilon the guarantee says little: e^10 is a likelihood ratio of about 22,000.
LARGE_EPSILON = 10.0


def large_epsilon(epsilon: float) -> str | None:
    """A warning for an epsilon too large to mean much, or None."""
    if epsilon <= LARGE_EPSILON:
        return None
    return (
        f"epsilon={epsilon:g} is above {LARGE_EPSILON:g}: the guarantee then means little (what the "
        "output reveals about one record may change an attacker's odds by up to e^epsilon)"
    )


def check_run_models(cfg: RunConfig, *, dequantize: bool) -> None:
    """Every PLM and the embedder resolve here (loading none); one error names every missing PLM.
    ``dequantize=False`` (the dry run) only checks that a packaged model's package is installed."""
    from wasp_vllm.engines.embedder import resolve_embedder
    from wasp_vllm.engines.registry import check_plms

    check_plms(cfg.plms, cfg.engine, dequantize=dequantize)
    resolve_embedder(cfg.embedder)


def votes(cfg: RunConfig) -> bool:
    """Whether the private records vote in this run (never with one round: the last never votes)."""
    return get_strategy(cfg.strategy).votes and cfg.rounds > 1


def privacy_plan(cfg: RunConfig, policy: RoundPolicy = DEFAULT_POLICY) -> PrivacyPlan:
    """Sigma for the records that vote: a ``--m`` draw makes their relation *replace*, a user cap
    multiplies the sensitivity by ``k`` (see :mod:`wasp_vllm.privacy.sampling`). The plan decides
    the vote schedule, the one ``policy`` asks for or the paper's (after every round but the last),
    and the whole budget goes to those votes."""
    privacy, rounds = cfg.privacy, cfg.rounds if votes(cfg) else 1
    shape = VoteShape(
        histograms=2 if cfg.far_votes == "on" else 1,
        after=policy.vote_request(cfg.rounds) if votes(cfg) else None,
    )
    try:
        shape.schedule(rounds)
    except ValueError as exc:
        raise ConfigError(f"round policy {policy.name!r} asks for {exc}") from None
    return plan_privacy(
        privacy.epsilon,
        privacy.delta,
        rounds,
        get_strategy(cfg.strategy).q(cfg.q),
        mode=privacy.accountant,
        unit=PrivacyUnit(
            voting_neighbour(privacy.neighbour, selected=cfg.private_limit is not None),
            privacy.records_per_unit,
        ),
        shares=BudgetShares(
            label_prior=privacy.label_prior_share if cfg.label_prior == "private" else 0.0,
            utility_check=privacy.utility_check_share if votes(cfg) else 0.0,
        ),
        votes=shape,
    )


def neighbourhood(cfg: RunConfig) -> Neighbourhood:
    """What the guarantee is about, in words and numbers (all public settings)."""
    unit = "user" if cfg.privacy_unit == "user" else "record"
    selected = cfg.private_limit is not None
    return Neighbourhood(
        unit=unit,
        input_file=f"{cfg.neighbour}: one {unit} of the file passed with --private",
        max_records_per_unit=cfg.privacy.records_per_unit,
        bounding="each user keeps at most k records, chosen by a keyed hash among its own records"
        if unit == "user"
        else None,
        selection=f"the M={cfg.private_limit} records of smallest keyed hash (public seed)"
        if selected
        else "every record of the file",
        voting_set=voting_neighbour(cfg.neighbour, selected).value,
        why="a draw of M by keyed hash turns one unit more or less in the file into at most k "
        "records swapped among those that vote"
        if selected
        else "the records that vote are the file's records",
    )


def _size_problems(cfg: RunConfig, task: TaskSpec) -> list[str]:
    """How --n, --rounds, --s and --m fail to fit together, each with the value that would fit.
    Decided on public settings only, never on how many records the file holds: an abort exactly
    when fewer than q records vote would publish that fact."""
    n_labels, n_plms = len(task.labels), len(cfg.plms)
    problems = []
    if cfg.n < n_plms * n_labels:
        problems.append(
            f"n={cfg.n} is too small: every PLM needs at least one sample per label "
            f"({n_plms} PLMs x {n_labels} labels = {n_plms * n_labels}); use --n {n_plms * n_labels} or more"
        )
    if not votes(cfg):
        return problems
    q = get_strategy(cfg.strategy).q(cfg.q)
    # With fewer voters than q a run still votes (each record's Top-q is over synthetic samples).
    if cfg.private_limit is not None and cfg.private_limit < q:
        problems.append(
            f"--m {cfg.private_limit} draws fewer records than q={q}: use --m {q} or more, or --q "
            f"{cfg.private_limit} or less"
        )
    largest = largest_pool(cfg.n, cfg.rounds, n_labels)
    if cfg.s > largest:
        problems.append(
            f"s={cfg.s} is larger than any pool can be (about {cfg.n // cfg.rounds // n_labels} samples "
            f"per label per round): use --s {largest}, or --n {n_for_pool(cfg.s, cfg.rounds, n_labels)} "
            f"or more for --s {cfg.s}"
        )
    return problems


def pool_fitting_s(cfg: RunConfig) -> int | None:
    """The --s this run's pools can fill, where ``cfg.s`` is larger and the run votes; else None
    (also when the task cannot be read: :func:`check_run` then names the problem)."""
    try:
        n_labels = len(get_task(cfg.task).labels)
    except ValueError:
        return None
    largest = largest_pool(cfg.n, cfg.rounds, n_labels)
    return largest if votes(cfg) and cfg.s > largest else None


def largest_pool(n: int, rounds: int, n_labels: int) -> int:
    """The largest --s the pools of a run can fill: a label's samples of the rounds that vote."""
    return max(1, n // rounds // n_labels * (rounds - 1))


def n_for_pool(s: int, rounds: int, n_labels: int) -> int:
    """The smallest --n whose pools hold ``s`` samples per label (rounds > 1)."""
    per_label_round = -(-s // (rounds - 1))
    return per_label_round * n_labels * rounds


def _private_problem(cfg: RunConfig, private_given: bool) -> str | None:
    """A --private file of a type we do not read (by its name), or a built-in data set used for a
    task it does not belong to: the records the user meant are their own file, which --private must
    name (the default 'drugs' serves the drugs task only)."""
    from wasp_vllm.data.resolve import builtin_name
    from wasp_vllm.data.sources import DataError, table_format
    from wasp_vllm.tasks.loader import looks_like_task_file

    if private_given:
        return None
    if (name := builtin_name(cfg.private)) is None:
        try:
            table_format(Path(cfg.private))
        except DataError as exc:
            return f"--private {exc}"
        return None
    task = cfg.task.strip().lower().replace("-", "_")
    if looks_like_task_file(cfg.task) or task != name:
        return (
            f"--private: the built-in {name!r} records belong to task {name!r}, not to task {cfg.task!r}; "
            "pass your own records with --private FILE (csv, tsv, jsonl or parquet)"
        )
    return None


def private_file_missing(cfg: RunConfig) -> str | None:
    """Why --private names no file here (from the file system: nothing is opened), or None. Not a
    check of the settings: a plan may be made where the data is not."""
    from wasp_vllm.data.resolve import builtin_name
    from wasp_vllm.data.sources import missing_file

    return None if builtin_name(cfg.private) is not None else missing_file(Path(cfg.private))


def per_round_totals(n: int, rounds: int) -> np.ndarray:
    """``n`` samples split evenly over the rounds (largest remainder)."""
    return allocate_quotas(n, np.full(rounds, 1.0 / rounds))
