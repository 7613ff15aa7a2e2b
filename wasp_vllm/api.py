"""The Python API: what the command line calls, for notebooks and scripts.

::

    import wasp_vllm

    result = wasp_vllm.generate(df, task="drugs", text_col="review", label_col="rating",
                                plms=["smollm2", "gemma3"], n=300, epsilon=4.0, out="runs/nb")
    synthetic = result.to_pandas()          # text, label, plm, round, ...
    result.privacy.epsilon_spent, result.privacy.sigma
    report = wasp_vllm.evaluate(result, test="drugs", task="drugs")   # report.accuracy, .macro_f1

``private`` may be a file path, a built-in set name (``"drugs"``), a pandas DataFrame, a list of
records (dicts), an Arrow table or a Hugging Face ``datasets.Dataset``.  In-memory data never
touches the disk: it is read where a file would be, and ``resume=True`` needs the same data
again (the run checks its keyed fingerprint).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq

from wasp_vllm.config import ConfigError, RunConfig, build_config, build_settings, read_config_file
from wasp_vllm.config.checks import check_writable_folder
from wasp_vllm.data.resolve import IN_MEMORY
from wasp_vllm.pipeline.store import PUBLISHED, CheckpointError, RunStore

if TYPE_CHECKING:
    from wasp_vllm.evaluation.results import SyntheticScores
    from wasp_vllm.pipeline import Collaborators
    from wasp_vllm.pipeline.estimate import RunPlan
    from wasp_vllm.pipeline.manifest import Manifest
    from wasp_vllm.privacy.report import PrivacyReport
    from wasp_vllm.tasks import TaskSpec

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RunResult:
    """A finished run: where its files are, what it published, and its samples."""

    out: Path
    manifest: Manifest

    @property
    def privacy(self) -> PrivacyReport:
        """What the run spent: (epsilon, delta), sigma, sensitivity, accountant, neighbourhood."""
        return self.manifest.privacy

    @property
    def synthetic_path(self) -> Path:
        return self.out / "synthetic.parquet"

    @property
    def shareable(self) -> list[Path]:
        """The files that may be published; ``out/private/`` must stay with the operator."""
        return [self.out / name for name in PUBLISHED]

    def to_arrow(self, embeddings: bool = False) -> pa.Table:
        table = pq.read_table(self.synthetic_path)
        return table if embeddings else table.drop_columns(["embedding"])

    def to_pandas(self, embeddings: bool = False) -> Any:
        return self.to_arrow(embeddings).to_pandas()

    def to_dataset(self) -> Any:
        """The samples as a Hugging Face ``datasets.Dataset`` (needs the ``datasets`` extra)."""
        import datasets

        return datasets.Dataset(self.to_arrow())


def as_table(data: Any, what: str = "private data") -> pa.Table | None:
    """An Arrow table for in-memory data (``what`` names it in an error, which never shows the
    data); None for a path or built-in name."""
    if data is None or isinstance(data, (str, Path)):
        return None
    if isinstance(data, pa.Table):
        return data
    if type(data).__module__.startswith("pandas"):
        return pa.Table.from_pandas(data, preserve_index=False)
    if type(data).__module__.startswith("datasets"):
        return data.data.table if hasattr(data.data, "table") else pa.Table.from_pylist(list(data))
    if isinstance(data, Sequence) and all(isinstance(r, Mapping) for r in data):
        return pa.Table.from_pylist([dict(r) for r in data])
    raise ConfigError(
        f"{what} of type {type(data).__name__} is not supported: pass a file path, a pandas "
        "DataFrame, a list of dicts, an Arrow table or a datasets.Dataset"
    )


def run_config(
    private: Any, config: str | Path | Mapping[str, Any] | RunConfig | None, settings: dict
) -> RunConfig:
    """Settings from a run file (or mapping, or config) overridden by keyword settings."""
    if isinstance(config, RunConfig):
        base = config.model_dump()
    elif isinstance(config, Mapping):
        base = dict(config)
    else:
        base = read_config_file(config) if config is not None else {}
    if private is not None:
        settings = {**settings, "private": private_name(private)}
    cfg = build_config(base, settings)
    if "s" in base or settings.get("s") is not None:
        return cfg
    # --s left to its default follows the pools this run will have (public: n, rounds, labels).
    from wasp_vllm.pipeline.context import pool_fitting_s

    fitted = pool_fitting_s(cfg)
    if fitted is None:
        return cfg
    log.info("--s %d: the largest pool this run's sizes allow (the default %d does not fit)", fitted, cfg.s)
    return build_config(base, {**settings, "s": fitted})


def private_name(private: Any) -> str:
    """How the run's settings name its private data: the path or built-in name, or ``<in-memory>``
    (the data itself is not looked at)."""
    return str(private) if isinstance(private, (str, Path)) else IN_MEMORY


def plan(
    private: Any = None,
    *,
    config: str | Path | Mapping[str, Any] | RunConfig | None = None,
    out: str | Path | None = None,
    resume: bool = False,
    overwrite: bool = False,
    **settings: Any,
) -> RunPlan:
    """What a run with these settings will release, ask and cost (``generate --dry-run``).

    Reads settings and public facts only: the private data is never opened (not even its size) and
    no model is loaded.  ``out`` (with ``resume``, ``overwrite``) is the folder the run would write:
    a warning says where the run would stop there, and nothing in it changes.
    ``print(plan(...).to_dict())`` or ``wasp-vllm generate ... --dry-run``."""
    from wasp_vllm.pipeline.context import check_run, check_run_models, private_file_missing
    from wasp_vllm.pipeline.estimate import plan_run

    _check_out_flags(resume, overwrite)
    cfg = run_config(private, config, settings)
    # The run's own checks (prepare makes them too), so a plan that prints is a run that starts.
    in_memory = private is not None and private_name(private) == IN_MEMORY  # the data stays unread
    check_run(cfg, private_given=in_memory)
    check_run_models(cfg, dequantize=False)
    if not in_memory and (missing := private_file_missing(cfg)):
        # a plan may be made where the data is not; the run needs it
        log.warning("--private %s: the run itself needs it", missing)
    if out is not None:
        _warn_where_out_stops(Path(out), resume=resume, overwrite=overwrite)
    return plan_run(cfg)


def _check_out_flags(resume: bool, overwrite: bool) -> None:
    if resume and overwrite:
        raise ConfigError("--resume and --overwrite exclude each other: continue the run or replace it")


def _warn_where_out_stops(out: Path, *, resume: bool, overwrite: bool) -> None:
    """The run's own checks of ``out`` (they change nothing), as warnings: a plan may be made on
    another machine than the run's."""
    try:
        RunStore(out).check(resume=resume, overwrite=overwrite)
        check_writable_folder(out, "--out")
    except (CheckpointError, ConfigError) as exc:
        log.warning("%s: the run would stop there", exc)


def generate(
    private: Any = None,
    *,
    out: str | Path | None = None,
    config: str | Path | Mapping[str, Any] | RunConfig | None = None,
    resume: bool = False,
    overwrite: bool = False,
    progress: Any = None,
    collaborators: Collaborators | None = None,
    **settings: Any,
) -> RunResult:
    """Generate a DP synthetic labelled data set; ``settings`` are :class:`RunConfig` fields.

    Returns a :class:`RunResult` (:func:`plan` gives the run's plan without running it: no
    private data read, no model loaded).  ``progress`` is a rich ``Progress`` to report to (None:
    silent).  ``collaborators`` hands the run other backends, a round policy or no throughput
    record (:class:`~wasp_vllm.pipeline.Collaborators`: the benchmark harness, audits, tests).
    """
    from wasp_vllm.pipeline import Collaborators, Run, default_backends, prepare, throughput
    from wasp_vllm.pipeline.estimate import plan_run

    if out is None:
        raise ConfigError("generate needs out=: the folder the run writes to")
    _check_out_flags(resume, overwrite)
    given = collaborators or Collaborators()
    cfg = run_config(private, config, settings)
    RunStore(out).check(resume=resume, overwrite=overwrite)
    check_writable_folder(out, "--out")
    # Every check (settings, data, model names, out) runs before the first model loads.
    ctx = prepare(
        cfg, check_models=given.backends is None, private_table=as_table(private), policy=given.policy
    )
    _log_plan(ctx)
    estimate = plan_run(cfg, ctx.plan)  # the run's own plan: sigma is calibrated once
    sources = "; ".join(sorted({e.source for e in estimate.engines}))
    log.info("estimated %s of work (throughput: %s)", _minutes(estimate.total_s), sources)
    chosen = given.backends or default_backends(cfg)
    # The engines' libraries print into out/private/engines.log, unless DEBUG logging (-v) asks for all
    quiet = not logging.getLogger("wasp_vllm").isEnabledFor(logging.DEBUG)
    run = Run(ctx, out, engine_factory=chosen.engine_factory, embedder=chosen.embedder, progress=progress,
              estimate=estimate, engine_log=quiet)  # fmt: skip
    try:
        manifest = run.execute(resume=resume, overwrite=overwrite)
    except (KeyboardInterrupt, SystemExit):  # Ctrl-C, or kill (the CLI makes SIGTERM a SystemExit)
        _say_where_it_stopped(RunStore(out), cfg.rounds)
        raise
    record_throughput = given.record_throughput
    if run.already_finished:
        log.info("the run in %s had finished: nothing to resume, its files are left as they were", out)
        record_throughput = False  # this session measured nothing
    if record_throughput and cfg.noise_seed is None:  # a void-epsilon run leaves nothing behind
        throughput.record(manifest, str(estimate.summary["device"]))
    result = RunResult(Path(out), manifest)
    _log_summary(result)
    return result


def _say_where_it_stopped(store: RunStore, rounds: int) -> None:
    """The round a stopped run was in (public: the progress display shows it), from its last
    committed state, and how to go on."""
    try:
        state = store.load_state()
    except (CheckpointError, OSError):  # nothing readable to resume from: say nothing
        return
    done = state.completed_rounds if state is not None else 0
    log.warning(
        "stopped in round %d of %d; `--resume` (resume=True) continues it from there",
        min(done + 1, rounds),
        rounds,
    )


def _log_summary(result: RunResult) -> None:
    """One line: what the command line's summary says first (samples, guarantee, epsilon spent,
    samples cut at the token cap)."""
    from wasp_vllm.pipeline.manifest import capped_note

    spent, capped = result.privacy, capped_note(result.manifest)
    log.info(
        "%d samples written to %s; %s, epsilon spent %.3f of %g%s", result.manifest.output.rows,
        result.synthetic_path, spent.guarantee, spent.epsilon_spent, spent.epsilon_budget,
        f"; {capped}" if capped else "",
    )  # fmt: skip


def _minutes(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min"


def _log_plan(ctx: Any) -> None:
    plan, cfg = ctx.plan, ctx.cfg
    sigma = f"{plan.sigma:.3f}" if plan.sigma is not None else "none (no voting rounds)"
    records = f"M={cfg.private_limit}" if cfg.private_limit is not None else "all"
    log.info(
        "%s: %s private records, %d PLMs, N=%d over T=%d rounds; (eps=%g, delta=%g) -> sigma=%s [%s, %s]",
        cfg.strategy, records, len(cfg.plms), cfg.n, cfg.rounds, cfg.epsilon, cfg.delta, sigma, plan.mode,
        plan.neighbour,
    )  # fmt: skip


def synthetic_task(synthetic: Path, task: str | None) -> TaskSpec:
    """The task an evaluation scores ``synthetic`` on: ``task`` (a name or file) when given, else
    the task its run's manifest (beside it) records, wherever its task file is now; never a default
    the user did not choose."""
    from wasp_vllm.pipeline.manifest import recorded_task
    from wasp_vllm.tasks import get_task

    if not synthetic.is_file():
        what = "not a file" if synthetic.exists() else "file not found"
        raise ConfigError(f"{synthetic}: {what} (pass the synthetic.parquet a run wrote)")
    path = synthetic.parent / "manifest.json"
    manifest = None
    if path.is_file():
        try:
            manifest = json.loads(path.read_text())
            ran = str(manifest.get("task") or manifest["config"]["task"])  # the top level: its name
        except (ValueError, KeyError, TypeError, AttributeError):
            raise ConfigError(f"{path} is not a wasp-vllm manifest: pass --task") from None
    if task is None:
        if manifest is None:
            raise ConfigError(f"no manifest.json beside {synthetic} names its task: pass --task NAME or FILE")
        return recorded_task(manifest)
    chosen = get_task(task)
    if manifest is not None and chosen.name != ran:
        log.warning("scoring on task %s, though the run generated for task %s", chosen.name, ran)
    return chosen


def run_defaults(synthetic: Path) -> dict[str, Any]:
    """The evaluation settings the run that wrote ``synthetic`` decided (its manifest beside it): the
    M and the seed of its private draw, so FID against ``--private`` reads the records it drew; none
    without a readable manifest."""
    try:
        config = json.loads((synthetic.parent / "manifest.json").read_text())["config"]
        return {"private_limit": config["private_limit"], "seed": int(config["seed"])}
    except (OSError, ValueError, KeyError, TypeError):
        return {}


def evaluate(
    synthetic: RunResult | str | Path,
    *,
    test: Any,
    task: str | None = None,
    private: Any = None,
    embedder: Any = None,
    **settings: Any,
) -> SyntheticScores:
    """Train a task model on the synthetic set and score it on real test data (see ``evaluate``).

    ``task``, and M and the seed of the private draw, default to what the run's manifest (beside
    the synthetic file) records.
    ``test`` is a file path, a built-in set name, or in-memory data as ``generate`` takes it (a
    pandas DataFrame, a list of dicts, an Arrow table, a ``datasets.Dataset``).  ``private``
    (optional: a file path or built-in set name) adds the operator's FID against the raw private
    records, in the report's ``operator_only`` section.  ``reference=`` adds the label agreement,
    also in ``operator_only`` unless ``reference_public=True`` declares that the reference holds
    no private record.  Any other keyword is a field of
    :class:`~wasp_vllm.evaluation.settings.EvalSettings`; ``embedder`` is an embedder name, or a
    ready encoder (anything with ``encode``).  Errors name the problem, never the data.
    """
    from wasp_vllm.evaluation import evaluate_synthetic
    from wasp_vllm.evaluation.settings import EvalSettings

    path = synthetic.synthetic_path if isinstance(synthetic, RunResult) else Path(synthetic)
    for name, value in (("private", private), ("reference", settings.get("reference"))):
        if value is not None and not isinstance(value, (str, Path)):
            raise ConfigError(
                f"{name}= takes a file path or a built-in set name, not a {type(value).__name__}"
            )
    test_table = as_table(test, "test data")
    spec = synthetic_task(path, task)
    values = {
        "test": str(test) if test_table is None else IN_MEMORY,
        "task": task or spec.name,
        "private": None if private is None else str(private),
    }
    if isinstance(embedder, str):
        values["embedder"] = embedder
    ready = None if embedder is None or isinstance(embedder, str) else embedder
    chosen = build_settings(EvalSettings, run_defaults(path) | values | settings)
    return evaluate_synthetic(path, chosen, embedder=ready, task=spec, test_table=test_table)
