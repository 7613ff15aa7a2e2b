"""The ``wasp-vllm`` Typer app: logging, one-line errors, and the ``generate`` command."""

from __future__ import annotations

import json
import logging
import os
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

from wasp_vllm.cli_options import config_command

app = typer.Typer(
    name="wasp-vllm",
    help="Differentially private synthetic text from several collaborating LLMs (WASP, arXiv 2502.00245).",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
console = Console(stderr=True)
log = logging.getLogger("wasp_vllm")


def setup_logging(verbose: bool) -> None:
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
def friendly_errors() -> Iterator[None]:
    """A user's mistake gets one clear line and exit code 2, not a traceback."""
    errors: tuple[type[BaseException], ...] = (*_user_errors(), ValueError)  # ValueError: inside the library
    try:
        yield
    except errors as exc:
        # One line: escaped (a path or label list may hold [brackets]) and never wrapped.
        message = " ".join(str(exc).split()) or type(exc).__name__
        console.print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
        raise typer.Exit(2) from None


@app.command()
@config_command
def generate(
    settings: dict[str, Any],
    config: Annotated[
        Path | None, typer.Option(help="A TOML/YAML file of these settings; flags override it.")
    ] = None,
    out: Annotated[
        Path,
        typer.Option(help="Output directory (synthetic.parquet, manifest.json; private/ stays with you)."),
    ] = Path("runs/latest"),
    resume: Annotated[
        bool, typer.Option("--resume", help="Continue the run in --out from its last finished round.")
    ] = False,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace a run already in --out.")] = False,
    verbose: Annotated[
        bool, typer.Option("--verbose", "-v", help="Debug logging (private: keep it).")
    ] = False,
) -> None:
    """Generate a DP synthetic labelled dataset with WASP (or a baseline strategy)."""
    setup_logging(verbose)
    with friendly_errors():
        from wasp_vllm.api import generate as generate_run

        with _progress() as progress:
            result = generate_run(
                out=out, config=config, resume=resume, overwrite=overwrite, progress=progress, **settings
            )
        _print_summary(result.manifest, out)


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
