"""The ``wasp-vllm`` Typer app: logging, one-line errors, and the ``generate`` command."""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.logging import RichHandler
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table

from wasp_vllm.cli.options import config_command
from wasp_vllm.cli.plan_view import print_work
from wasp_vllm.engines.chatter import quiet_third_parties
from wasp_vllm.privacy.clock import PublicClock

if TYPE_CHECKING:
    from wasp_vllm.pipeline.manifest import Manifest
    from wasp_vllm.privacy.utility import UtilityFigures

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
        # No time column at the default level: the time between two published lines would say how
        # long the private work between them took (-v output is the operator's own).
        handlers=[RichHandler(console=console, show_path=False, show_time=verbose)],
        force=True,
    )
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if not verbose:
        quiet_third_parties()


def _user_errors() -> tuple[type[BaseException], ...]:
    from wasp_vllm.config import ConfigError
    from wasp_vllm.data.records import DataError
    from wasp_vllm.engines.registry import ModelError
    from wasp_vllm.pipeline import PipelineError
    from wasp_vllm.pipeline.store import CheckpointError
    from wasp_vllm.privacy.accountant import PrivacyBudgetExceeded
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


def os_error_line(exc: OSError) -> str:
    """An operating-system error as the user can act on it: what failed, on which path.

    ``str(exc)`` of an OSError is ``[Errno 2] No such file or directory: 'x'``; the errno is noise
    and a folder removed under a running run reads better as "no longer exists"."""
    what = exc.strerror or type(exc).__name__
    path = exc.filename
    if path is None:
        return str(exc) or what
    if (
        isinstance(exc, FileNotFoundError)
        and Path(path).parent != Path(path)
        and not Path(path).parent.exists()
    ):
        return f"{path}: its folder {Path(path).parent} no longer exists (removed while the command ran?)"
    return f"{path}: {what.lower()}"


@contextmanager
def friendly_errors() -> Iterator[None]:
    """A user's mistake, or a file or folder that fails under the command (unwritable, removed,
    full disk), gets one clear line and exit code 2, not a traceback; ``-v`` adds the traceback."""
    # ValueError: inside the library; OSError: a file or folder that failed under the command
    errors: tuple[type[BaseException], ...] = (*_user_errors(), ValueError, OSError)
    try:
        yield
    except errors as exc:
        if log.isEnabledFor(logging.DEBUG):  # -v: the operator's own output, traceback included
            console.print_exception()
        text = os_error_line(exc) if isinstance(exc, OSError) else str(exc)
        # One line: escaped (a path or label list may hold [brackets]) and never wrapped.
        message = " ".join(text.split()) or type(exc).__name__
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
    dry_run: Annotated[
        bool,
        typer.Option(
            "--dry-run",
            help="Print the plan and stop: sigma of every release and the epsilon split, samples per "
            "round and PLM, tokens and wall time per engine. Reads no private data, loads no model, "
            "writes nothing; warns where the run would stop on this machine (no --private file, an "
            "--out it may not write).",
        ),
    ] = False,
    verbose: Annotated[
        bool, typer.Option("--verbose", "-v", help="Debug logging (private: keep it).")
    ] = False,
) -> None:
    """Generate a DP synthetic labelled dataset with WASP (or a baseline strategy)."""
    setup_logging(verbose)
    with friendly_errors(), _sigterm_exits():
        from wasp_vllm.api import generate as generate_run

        if dry_run:
            from wasp_vllm.api import plan
            from wasp_vllm.cli.plan_view import print_plan

            # (plan warns where --out would stop the run here)
            print_plan(
                plan(config=config, out=out, resume=resume, overwrite=overwrite, **settings), Console()
            )
            return

        with _progress() as progress, _out_kept(out):
            result = generate_run(
                out=out, config=config, resume=resume, overwrite=overwrite, progress=progress, **settings
            )
        _print_summary(result.manifest, out)


@contextmanager
def _out_kept(out: Path) -> Iterator[None]:
    """A file error while the run's folder is gone means the folder was removed under the run: say
    that, not which of its files the store happened to be writing."""
    try:
        yield
    except OSError as exc:
        if out.is_dir():
            raise
        from wasp_vllm.pipeline.store import CheckpointError

        raise CheckpointError(
            f"--out {out} was removed while the run ran; start it again (nothing of it is left)"
        ) from exc


@contextmanager
def _sigterm_exits() -> Iterator[None]:
    """While the command runs, SIGTERM ends it as Ctrl-C does, through every ``finally`` (engines
    closed, the engine log kept): its default action would end the process at once, cleaning up
    nothing.  The previous handler is back afterwards (the CLI may run inside another program)."""

    def stop(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)

    if threading.current_thread() is not threading.main_thread():
        yield  # only the main thread may set a handler
        return
    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextmanager
def _progress() -> Iterator[Progress]:
    progress = _LazyProgress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("samples"),
        TimeElapsedColumn(),
        TextColumn("eta"),
        TimeRemainingColumn(),
        console=console,
        transient=False,
        get_time=PublicClock(),  # elapsed time and ETA of public work: the loop stops it for private steps
    )
    with progress:
        yield progress


class _LazyProgress(Progress):
    """A progress display that starts with its first task: a command refused before any work then
    prints its one error line and nothing else (no empty display line)."""

    def __enter__(self) -> _LazyProgress:
        return self

    def add_task(self, *args: Any, **kwargs: Any) -> TaskID:
        if not self.live.is_started:
            self.start()
        return super().add_task(*args, **kwargs)

    def stop(self) -> None:
        if self.live.is_started:  # rich prints an empty line on stop where stderr is not a terminal
            super().stop()


def _distinct(values: Sequence[float]) -> str:
    """'5.264' for one value, '4.835 / 5.264' for several (the label prior and the votes), '-' for none."""
    return " / ".join(f"{v:.3f}" for v in sorted(set(values))) or "-"


def print_utility_check(check: UtilityFigures) -> None:
    """The utility check's figures at the default level: each set's macro-F1 on the private records
    with its interval, and one line that reads them (a warning where zero-shot does better)."""
    scores = ", ".join(f"{s.name} {s.macro_f1}" for s in check.sets)
    console.print(
        f"utility check on your records (macro-F1, {check.confidence:.0%} intervals): {scores}",
        highlight=False,
    )
    style = "[bold yellow]warning:[/] " if check.zero_shot_better else ""
    console.print(f"{style}the synthetic set is {check.reading()}", highlight=False)


def _print_summary(manifest: Manifest, out: Path) -> None:
    from wasp_vllm.pipeline.manifest import capped_note
    from wasp_vllm.pipeline.store import RunStore

    plms = manifest.config["plms"]
    table = Table(
        title=f"{manifest.output.rows} samples written to {out}",
        caption="per round and PLM: samples kept of those generated (weight before the round)",
    )
    for column in ("round", *plms):
        table.add_column(column)
    for record in manifest.rounds:
        weights = dict(zip(plms, record.weights_before, strict=True))
        cells = [
            f"{record.kept.get(p, 0)}"
            + (f" of {record.generated[p]}" if p in record.generated else "")
            + f" (w={weights[p]:.2f})"
            for p in plms
        ]
        table.add_row(str(record.round), *cells)
    console.print(table)
    privacy = manifest.privacy
    console.print(
        f"privacy: {privacy.guarantee}; epsilon spent {privacy.epsilon_spent:.3f} of "
        f"{privacy.epsilon_budget:g}, sigma {_distinct(privacy.sigmas)}, "
        f"sensitivity {_distinct(privacy.sensitivities)}, {privacy.compositions} releases",
        highlight=False,
    )
    if (check := privacy.utility_check) is not None:
        print_utility_check(check)
    print_work(manifest.work, console)
    if capped := capped_note(manifest):
        console.print(f"[bold yellow]note:[/] {escape(capped)}", highlight=False)
    # A round's missing samples are asked again in the next: the last round's figure is the run's.
    missing = manifest.rounds[-1].missing if manifest.rounds else 0
    if missing:
        dropped = ", ".join(manifest.plms.dropped) or "none"
        console.print(
            f"[bold yellow]short by {missing} samples[/]: no PLM could write them (dropped: {dropped})"
        )
    console.print(
        f"share: {out}/synthetic.parquet, {out}/manifest.json, {out}/README.md (the data set's card; "
        f"`wasp-vllm publish {out} DIR` gathers them, `wasp-vllm report {out}` draws the run)\n"
        f"keep to yourself: {out}/private/ (checkpoints; the noise key is deleted now the run is done"
        + (", engine messages)" if RunStore(out).engine_log_path.is_file() else ")"),
        highlight=False,
    )
