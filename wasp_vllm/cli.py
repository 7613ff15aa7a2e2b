"""The ``wasp-vllm`` command line."""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.logging import RichHandler
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

app = typer.Typer(
    name="wasp-vllm",
    help="Differentially private synthetic text from several collaborating LLMs (WASP, arXiv 2502.00245).",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
console = Console(stderr=True)
log = logging.getLogger("wasp_vllm")


def _setup_logging(verbose: bool) -> None:
    level = logging.DEBUG if verbose else logging.INFO
    if verbose:
        console.print(
            "[bold yellow]warning:[/] -v prints statistics of the private data (lines marked "
            "[private]); keep this output to yourself",
            highlight=False,
        )
    logging.basicConfig(
        level=level,
        format="%(message)s",
        handlers=[RichHandler(console=console, show_path=False)],
        force=True,
    )
    for noisy in ("httpx", "sentence_transformers", "transformers", "urllib3", "filelock"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "DEBUG" if verbose else "WARNING")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def _user_errors() -> tuple[type[BaseException], ...]:
    from wasp_vllm.config import ConfigError
    from wasp_vllm.data import DataError
    from wasp_vllm.engines.registry import ModelError
    from wasp_vllm.pipeline import PipelineError
    from wasp_vllm.privacy.accountant import PrivacyBudgetExceeded
    from wasp_vllm.store import CheckpointError
    from wasp_vllm.tasks import TaskError

    return (
        ConfigError,
        DataError,
        ModelError,
        PipelineError,
        PrivacyBudgetExceeded,
        CheckpointError,
        TaskError,
    )


@contextmanager
def _friendly_errors() -> Iterator[None]:
    """A user's mistake gets one clear line and exit code 2, not a traceback."""
    try:
        yield
    except (*_user_errors(), ValueError) as exc:  # ValueError: validation inside the library
        # One line: escaped (a path or label list may hold [brackets]) and never wrapped.
        message = " ".join(str(exc).split()) or type(exc).__name__
        console.print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
        raise typer.Exit(2) from None


def _split(value: str | None) -> list[str] | None:
    return [v.strip() for v in value.split(",") if v.strip()] if value else None


@app.command()
def generate(
    plms: Annotated[
        str | None,
        typer.Option(
            help="Comma-separated PLMs: presets (see `wasp-vllm models`), model directories, "
            "or name@http://host:8000/v1 for a served model. Default: smollm2,gemma3.",
        ),
    ] = None,
    task: Annotated[
        str | None, typer.Option(help="Task name (see `wasp-vllm tasks`) or a task TOML/YAML file.")
    ] = None,
    private: Annotated[
        str | None,
        typer.Option(help="Private data: a csv/tsv/jsonl/parquet file, or 'drugs' (built-in set)."),
    ] = None,
    text_col: Annotated[str | None, typer.Option(help="Column of the private file holding the text.")] = None,
    label_col: Annotated[
        str | None, typer.Option(help="Column of the private file holding the label.")
    ] = None,
    attribute_col: Annotated[
        str | None, typer.Option(help="Optional column with an attribute (e.g. genre).")
    ] = None,
    user_col: Annotated[
        str | None, typer.Option(help="Optional column with a user id (user-level DP).")
    ] = None,
    private_limit: Annotated[
        int | None,
        typer.Option(
            "--m",
            help="Use M records of the private file (default 100): the M of smallest keyed hash, so one "
            "record more or less in the file swaps at most one of them (the accountant assumes that).",
        ),
    ] = None,
    n: Annotated[
        int | None, typer.Option("--n", help="Total number of synthetic samples (default 300).")
    ] = None,
    rounds: Annotated[
        int | None, typer.Option(help="Rounds T; the private data votes in the first T-1.")
    ] = None,
    epsilon: Annotated[
        float | None, typer.Option(help="Privacy budget epsilon for the whole run (default 4).")
    ] = None,
    delta: Annotated[
        float | None, typer.Option(help="Privacy parameter delta, in (0, 1) (default 1e-5).")
    ] = None,
    q: Annotated[
        int | None, typer.Option("--q", help="Top-Q nearest and furthest votes per private record.")
    ] = None,
    s: Annotated[
        int | None, typer.Option("--s", help="In-context samples per prompt (and pool size per label).")
    ] = None,
    accountant: Annotated[
        str | None, typer.Option(help="'exact' (tight analytic Gaussian, default) or 'paper' (as printed).")
    ] = None,
    neighbour: Annotated[
        str | None, typer.Option(help="'add_remove' (default) or 'replace' neighbouring.")
    ] = None,
    privacy_unit: Annotated[
        str | None,
        typer.Option(help="'record' (default) or 'user' (needs --user-col and --max-records-per-user)."),
    ] = None,
    max_records_per_user: Annotated[
        int | None,
        typer.Option(
            help="User-level DP: a public cap k; each user keeps at most k records and one user "
            "counts as k records in the sensitivity."
        ),
    ] = None,
    strategy: Annotated[
        str | None, typer.Option(help="'wasp' (default), 'aug-pe', 'fusegen' or 'pre-text' (federated).")
    ] = None,
    no_contrast: Annotated[bool, typer.Option("--no-contrast", help="Ablation: good samples only.")] = False,
    no_weighting: Annotated[
        bool, typer.Option("--no-weighting", help="Ablation: keep PLM weights equal.")
    ] = False,
    parties: Annotated[int | None, typer.Option(help="Federated: number of data parties L.")] = None,
    dirichlet: Annotated[
        float | None, typer.Option(help="Federated: Dirichlet alpha of the label split.")
    ] = None,
    tolerance: Annotated[
        int | None, typer.Option(help="Federated: colluding/dropped parties tolerated.")
    ] = None,
    engine: Annotated[
        str | None, typer.Option(help="'auto' (vLLM where it can, else hf), 'vllm', 'hf', 'openai'.")
    ] = None,
    embedder: Annotated[
        str | None, typer.Option(help="Sentence embedder: 'auto', 'sentence-t5-base', 'minilm' or a path.")
    ] = None,
    max_new_tokens: Annotated[
        int | None, typer.Option(help="Token cap per sample (default: the task's).")
    ] = None,
    top_k: Annotated[
        int | None, typer.Option(help="Sample each token from the k likeliest (default 50; 0 = off).")
    ] = None,
    seed: Annotated[
        int | None, typer.Option(help="Seed for prompts and sampling (not for the DP noise).")
    ] = None,
    noise_seed: Annotated[
        int | None,
        typer.Option(help="Fix the DP noise seed. Tests only: anyone knowing it can remove the noise."),
    ] = None,
    sleep_mode: Annotated[
        bool,
        typer.Option("--sleep-mode", help="GPU: PLMs that do not fit together take turns (vLLM sleep mode)."),
    ] = False,
    config: Annotated[
        Path | None, typer.Option(help="A TOML/YAML file of these settings; flags override it.")
    ] = None,
    out: Annotated[
        Path, typer.Option(help="Output directory (synthetic.parquet, manifest.json, checkpoints).")
    ] = Path("runs/latest"),
    resume: Annotated[
        bool, typer.Option("--resume", help="Continue the run in --out from its last finished round.")
    ] = False,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace a run already in --out.")] = False,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Debug logging.")] = False,
) -> None:
    """Generate a DP synthetic labelled dataset with WASP (or a baseline strategy)."""
    _setup_logging(verbose)
    with _friendly_errors():
        from wasp_vllm.config import ConfigError, build_config, read_config_file
        from wasp_vllm.pipeline import Run, prepare
        from wasp_vllm.store import RunStore

        overrides: dict[str, Any] = dict(
            plms=_split(plms),
            task=task,
            private=private,
            text_col=text_col,
            label_col=label_col,
            attribute_col=attribute_col,
            user_col=user_col,
            private_limit=private_limit,
            n=n,
            rounds=rounds,
            epsilon=epsilon,
            delta=delta,
            q=q,
            s=s,
            accountant=accountant,
            neighbour=neighbour,
            privacy_unit=privacy_unit,
            max_records_per_user=max_records_per_user,
            strategy=strategy,
            parties=parties,
            dirichlet=dirichlet,
            tolerance=tolerance,
            engine=engine,
            embedder=embedder,
            max_new_tokens=max_new_tokens,
            top_k=top_k,
            seed=seed,
            noise_seed=noise_seed,
            sleep_mode=True if sleep_mode else None,
            contrastive=False if no_contrast else None,
            weighting=False if no_weighting else None,
        )
        if resume and overwrite:
            raise ConfigError("--resume and --overwrite exclude each other: continue the run or replace it")
        cfg = build_config(read_config_file(config) if config else {}, overrides)
        RunStore(out).check(resume=resume, overwrite=overwrite)
        # Every check (settings, data, model names, --out) runs before the first model loads.
        ctx = prepare(cfg, check_models=True)
        _log_plan(ctx)
        with _progress() as progress:
            manifest = Run(ctx, out, progress=progress).execute(resume=resume, overwrite=overwrite)
        _print_summary(manifest, out)


@contextmanager
def _progress() -> Iterator[Progress]:
    progress = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=False,
    )
    with progress:
        yield progress


def _log_plan(ctx: Any) -> None:
    plan = ctx.plan
    sigma = f"{plan.sigma:.3f}" if plan.sigma is not None else "none (no voting rounds)"
    m = ctx.cfg.private_limit
    log.info(
        "%s: %s private records, %d PLMs, N=%d over T=%d rounds; (eps=%g, delta=%g) -> sigma=%s [%s, %s]",
        ctx.cfg.strategy,
        f"M={m}" if m is not None else "all",
        len(ctx.cfg.plms),
        ctx.cfg.n,
        ctx.cfg.rounds,
        ctx.cfg.epsilon,
        ctx.cfg.delta,
        sigma,
        plan.mode,
        plan.neighbour,
    )


def _print_summary(manifest: dict[str, Any], out: Path) -> None:
    table = Table(title=f"run written to {out}")
    for column in ("round", *manifest["config"]["plms"]):
        table.add_column(column)
    for record in manifest["rounds"]:
        weights = dict(zip(manifest["config"]["plms"], record["weights_before"], strict=True))
        cells = [f"{record['kept'].get(p, 0)} (w={weights[p]:.2f})" for p in manifest["config"]["plms"]]
        table.add_row(str(record["round"]), *cells)
    console.print(table)
    spent = manifest["privacy"]["ledger"]
    console.print(f"privacy spent: {json.dumps(spent, default=str)}", highlight=False)


@app.command()
def evaluate(
    synthetic: Annotated[Path, typer.Option(help="synthetic.parquet written by `generate`.")],
    test: Annotated[
        str, typer.Option(help="Real labelled test set: a file, or 'drugs' (built-in test split).")
    ],
    task: Annotated[str, typer.Option(help="Task name or task file (gives the label set).")] = "drugs",
    private: Annotated[
        str | None,
        typer.Option(help="Private set for FID (synthetic vs private embeddings); omit to skip FID."),
    ] = None,
    private_limit: Annotated[
        int | None, typer.Option("--m", help="Same M as the generation run (for FID).")
    ] = None,
    seed: Annotated[
        int, typer.Option(help="Seed of the task model, and of the private sample (as in generate).")
    ] = 0,
    model: Annotated[
        str, typer.Option(help="Task model: 'logreg' (CPU, on embeddings) or 'bert' (fine-tune).")
    ] = "logreg",
    bert_path: Annotated[
        str | None, typer.Option(help="Local BERT-like model directory for --model bert.")
    ] = None,
    embedder: Annotated[str, typer.Option(help="Sentence embedder for logreg and FID.")] = "auto",
    text_col: Annotated[str, typer.Option(help="Text column of the test file.")] = "text",
    label_col: Annotated[str, typer.Option(help="Label column of the test file.")] = "label",
    out: Annotated[Path | None, typer.Option(help="Also write the report as JSON here.")] = None,
) -> None:
    """Train a task model on the synthetic set and score it on real test data (accuracy, macro-F1, FID)."""
    _setup_logging(False)
    with _friendly_errors():
        from wasp_vllm.evaluate import EvaluationError, evaluate_synthetic

        try:
            report = evaluate_synthetic(
                str(synthetic),
                test,
                task,
                private_source=private,
                model=model,
                embedder_spec=embedder,
                seed=seed,
                text_col=text_col,
                label_col=label_col,
                private_limit=private_limit,
                private_seed=seed,
                bert_path=bert_path,
            )
        except EvaluationError as exc:
            raise ValueError(str(exc)) from None
        text = json.dumps(report, indent=2, default=str)
        if out is not None:
            out.write_text(text + "\n")
        typer.echo(text)


@app.command()
def hotpate(
    private: Annotated[str, typer.Option(help="Private data: a file, or 'drugs'.")] = "drugs",
    task: Annotated[str, typer.Option(help="Task name or task file.")] = "drugs",
    text_col: Annotated[str, typer.Option(help="Text column of the private file.")] = "text",
    label_col: Annotated[str, typer.Option(help="Label column of the private file.")] = "label",
    private_limit: Annotated[int | None, typer.Option("--m", help="Use M private records.")] = None,
    teachers: Annotated[
        int, typer.Option(help="Number of teachers (disjoint parts of the private data).")
    ] = 64,
    max_tokens: Annotated[int, typer.Option(help="Tokens per synthetic record.")] = 48,
    n: Annotated[int, typer.Option("--n", help="Synthetic records to write.")] = 10,
    model: Annotated[str, typer.Option(help="PLM preset or model directory (hf engine).")] = "smollm2",
    epsilon: Annotated[float, typer.Option(help="Privacy budget for all generated tokens.")] = 4.0,
    delta: Annotated[float, typer.Option(help="Privacy parameter delta.")] = 1e-5,
    ensemble: Annotated[
        str, typer.Option(help="'coordinated' (Hot PATE) or 'independent' (cold PATE).")
    ] = "coordinated",
    seed: Annotated[int, typer.Option(help="Seed of the shared randomness and prompts.")] = 0,
    out: Annotated[Path, typer.Option(help="Output directory (synthetic.parquet, manifest.json).")] = Path(
        "runs/hotpate"
    ),
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace a run already in --out.")] = False,
) -> None:
    """Hot PATE: synthetic records from DP aggregation of many teachers' next-token distributions."""
    _setup_logging(False)
    with _friendly_errors():
        from wasp_vllm.data import load_private
        from wasp_vllm.hotpate.generate import run_hotpate
        from wasp_vllm.privacy.sampling import voting_neighbour
        from wasp_vllm.store import RunStore, write_json, write_parquet
        from wasp_vllm.tasks import get_task

        spec = get_task(task)
        data = load_private(private, spec, text_col, label_col, limit=private_limit, seed=seed)
        store = RunStore(out)
        store.prepare(resume=False, overwrite=overwrite)
        secret = store.secret(None, create=True)  # the noise comes from a secret key, never --seed
        table, report = run_hotpate(
            data.texts,
            [spec.labels[i] for i in data.labels],
            spec.labels,
            model=model,
            teachers=teachers,
            max_tokens=max_tokens,
            n_samples=n,
            epsilon=epsilon,
            delta=delta,
            seed=seed,
            ensemble=ensemble,  # type: ignore[arg-type]
            # An --m draw swaps at most one record, which may touch two teachers.
            neighbour=voting_neighbour("add_remove", selected=private_limit is not None).value,
            noise_rng=secret.generator("hotpate"),
        )
        write_parquet(out / "synthetic.parquet", table)
        # Published: settings and functions of the releases only (no count or hash of the records).
        write_json(
            out / "manifest.json",
            {"method": "hotpate", "privacy": report, "private_data": {"requested_m": private_limit}},
        )
        console.print(f"wrote {table.num_rows} records to {out}")


@app.command()
def privacy(
    epsilon: Annotated[float, typer.Option(help="Target epsilon.")] = 4.0,
    delta: Annotated[float, typer.Option(help="Target delta.")] = 1e-5,
    rounds: Annotated[int, typer.Option(help="Rounds T (T-1 of them vote).")] = 5,
    q: Annotated[int, typer.Option("--q", help="Top-Q votes per private record.")] = 8,
    records_per_unit: Annotated[int, typer.Option(help="Records per user (user-level DP).")] = 1,
) -> None:
    """Print the noise scale sigma under both accountants for these settings."""
    with _friendly_errors():
        from wasp_vllm.privacy.accountant import plan_privacy

        table = Table(title=f"eps={epsilon}, delta={delta}, T={rounds}, Q={q}")
        for col in ("accountant", "neighbour", "sensitivity", "sigma", "eps actually spent (exact)"):
            table.add_column(col)
        for mode, neighbour in (("paper", "add_remove"), ("exact", "add_remove"), ("exact", "replace")):
            plan = plan_privacy(
                epsilon, delta, rounds, q, mode=mode, neighbour=neighbour, records_per_unit=records_per_unit
            )
            sigma = "-" if plan.sigma is None else f"{plan.sigma:.3f}"
            table.add_row(
                mode, neighbour, f"{plan.sensitivity:.4f}", sigma, f"{plan.epsilon_exact_spent:.3f}"
            )
        Console().print(table)


@app.command()
def tasks() -> None:
    """List the built-in tasks with their labels."""
    from wasp_vllm.tasks import get_task, list_tasks

    table = Table(title="tasks (or pass a TOML/YAML task file to --task)")
    for col in ("name", "labels", "attribute"):
        table.add_column(col)
    for name in list_tasks():
        spec = get_task(name)
        table.add_row(name, ", ".join(spec.labels), spec.attribute_name or "-")
    Console().print(table)


@app.command()
def models() -> None:
    """List the named PLM presets and whether each resolves on this machine."""
    from wasp_vllm.engines.registry import PRESETS, ModelError, resolve_plm

    table = Table(title="PLM presets (or pass a model directory / name@endpoint to --plms)")
    for col in ("name", "model", "kind", "available here"):
        table.add_column(col)
    for preset in PRESETS.values():
        try:
            available = "yes" if preset.packaged else str(resolve_plm(preset.name).path)
        except ModelError:
            available = "no (not in the local HF cache)"
        kind = "seq2seq (hf engine)" if preset.seq2seq else ("chat" if preset.chat else "base")
        table.add_row(preset.name, preset.hf_id or preset.description, kind, available)
    Console().print(table)


if __name__ == "__main__":  # vLLM's CPU workers re-import the entry module
    sys.exit(app())
