"""What the engines' libraries print (vLLM, transformers, torch, FAISS, ...), kept off the terminal.

Their start-up lines, weight-loading bars and C++ warnings would bury the progress display and the
few lines a user reads.  While a run's engines work, :func:`engine_messages` sends whatever is
written to the process's stderr descriptor (vLLM's engine processes inherit it) to the run's own
``private/engines.log``, quiets the libraries' loggers to their errors, and keeps this package's
log lines (and the command line's display) on the terminal.  The log is opened only once the run
holds its folder, and appended to: a refused command leaves an earlier run's log as it was, a
killed run leaves its log where the run is, and ``--resume`` adds to it.  DEBUG logging (``-v``)
keeps it all on the terminal instead.
"""

from __future__ import annotations

import io
import logging
import os
import sys
import warnings
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager, suppress
from pathlib import Path
from typing import IO, Any

log = logging.getLogger(__name__)

#: Libraries whose start-up chatter (INFO lines, weight-loading bars, warnings) hides the one
#: progress display a user wants; DEBUG logging shows it all.
THIRD_PARTY_LOGGERS = ("vllm", "faiss", "transformers", "sentence_transformers", "torch", "httpx", "httpcore",
                       "urllib3", "filelock", "huggingface_hub", "accelerate", "datasets")  # fmt: skip
#: Environment read by the libraries (and by vLLM's engine processes) when they start.
QUIET_ENV = {
    "VLLM_LOGGING_LEVEL": "ERROR",
    "TRANSFORMERS_VERBOSITY": "error",
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    "TQDM_DISABLE": "1",
    "PYTHONWARNINGS": "ignore",
}
STDERR_FD = 2


def quiet_third_parties() -> None:
    """For the whole process (the command line): the libraries' loggers to errors, their start-up
    settings quiet, Python's warnings off."""
    for name in THIRD_PARTY_LOGGERS:
        logging.getLogger(name).setLevel(logging.ERROR)
    for key, value in QUIET_ENV.items():
        os.environ.setdefault(key, value)
    warnings.filterwarnings("ignore")


@contextmanager
def engine_messages(path: Path | None) -> Iterator[Path | None]:
    """While the block runs, the stderr descriptor writes to ``path`` (appended, mode 0600) and the
    libraries are quiet, as the module docstring says; None (or a process without a stderr
    descriptor) changes nothing.  A log the block made and left empty is removed; a block that
    fails names the log (where it holds something) in an INFO line."""
    if path is None:
        yield None
        return
    new = not path.exists()
    log_fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    failed = False
    try:
        with _stderr_to(log_fd):
            yield path
    except BaseException:
        failed = True
        raise
    finally:
        empty = os.fstat(log_fd).st_size == 0
        os.close(log_fd)
        if new and empty:  # nothing was said: no file either
            path.unlink(missing_ok=True)
        elif failed:
            log.info("engine messages: %s", path)  # on the terminal again: where to look


@contextmanager
def _stderr_to(log_fd: int) -> Iterator[None]:
    try:
        saved = os.dup(STDERR_FD)
    except OSError:  # no stderr descriptor to move (a detached process)
        yield
        return
    try:
        with ExitStack() as stack:
            terminal = stack.enter_context(os.fdopen(os.dup(saved), "w", buffering=1))
            stack.enter_context(_quiet_libraries())
            stack.enter_context(_own_lines_on(terminal))
            _flush(sys.stderr)
            os.dup2(log_fd, STDERR_FD)
            try:
                yield
            finally:
                _flush(sys.stderr)
                os.dup2(saved, STDERR_FD)
    finally:
        os.close(saved)


@contextmanager
def _quiet_libraries() -> Iterator[None]:
    """:func:`quiet_third_parties` for the block only: levels, environment and filters come back."""
    loggers = [logging.getLogger(name) for name in THIRD_PARTY_LOGGERS]
    levels = [logger.level for logger in loggers]
    env = {key: os.environ.get(key) for key in QUIET_ENV}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for logger in loggers:
            logger.setLevel(max(logger.level, logging.ERROR))
        quiet = [logger.level for logger in loggers]
        for key, value in QUIET_ENV.items():
            os.environ.setdefault(key, value)
        try:
            yield
        finally:
            for logger, level, ours in zip(loggers, levels, quiet, strict=True):
                if logger.level == ours:  # else the library set its own level when it was imported
                    logger.setLevel(level)
            for key, before in env.items():
                if before is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = before


@contextmanager
def _own_lines_on(terminal: IO[str]) -> Iterator[None]:
    """This package's log lines keep the terminal: every handler of the root and ``wasp_vllm``
    loggers that writes to the stderr descriptor (a plain stream handler, or rich's, through its
    console, which the command line's progress display shares) writes to ``terminal`` instead."""
    undo = []
    for handler in {*logging.getLogger().handlers, *logging.getLogger("wasp_vllm").handlers}:
        console = getattr(handler, "console", None)  # rich's RichHandler
        if isinstance(handler, logging.StreamHandler) and _on_stderr(handler.stream):
            undo.append((handler.setStream, handler.setStream(terminal)))
        elif console is not None and _on_stderr(console.file):
            undo.append((_console_setter(console), getattr(console, "_file", None)))
            console.file = terminal
    try:
        yield
    finally:
        for restore, before in reversed(undo):
            restore(before)


def _console_setter(console: Any) -> Any:
    def restore(before: Any) -> None:
        console.file = before  # None again: the console follows sys.stderr, as it did

    return restore


def _on_stderr(stream: Any) -> bool:
    try:
        return bool(stream.fileno() == STDERR_FD)
    except (AttributeError, OSError, ValueError, io.UnsupportedOperation):
        return False


def _flush(stream: Any) -> None:
    with suppress(AttributeError, OSError, ValueError):  # a closed or unusual stream: nothing to flush
        stream.flush()
