"""vLLM's engine-core process ends with the run that started it, however the run ends.

vLLM (V1) runs each ``vllm.LLM``'s engine core in a child process that ignores SIGTERM and SIGINT
(it waits for its front end to ask it to shut down).  When the front end dies without asking
(``kill -9``, or SIGTERM's default action, which runs no cleanup) the core stays alive, holding
its memory, until someone finds it.  So every engine core a run starts in a process of its own
gets a watchdog thread that polls its parent's pid; once the parent is gone (the core was
re-parented) it kills its own descendants and exits.  (On a CPU of a few cores a run keeps its
engines in its own process, ``engines/vllm_engine.py: cpu_engine_env``: nothing to leave behind.)

How it gets there: vLLM starts the core with ``target=EngineCoreProc.run_engine_core``.
:func:`install` replaces that target with :func:`run_engine_core_watched`, a module-level function
that a spawned child imports by name (and a forked one simply has), which starts the watchdog and
then runs vLLM's own target.  PR_SET_PDEATHSIG is not used: it fires when the *thread* that
started the child ends, and engines may be started from a worker thread that ends before the run.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)

#: Seconds between two looks at the parent's pid (an orphan lives at most about this long).
POLL_S = 0.5

#: vLLM's own target, kept where :func:`install` replaced it (a forked child finds it here; a
#: spawned one imports vLLM afresh and reads the unpatched one).
_original: Callable[..., Any] | None = None


def install() -> None:
    """Make every engine core started from now on watch its parent (idempotent; no-op without
    vLLM's V1 engine)."""
    global _original
    try:
        from vllm.v1.engine.core import EngineCoreProc
    except ImportError:  # another vLLM layout: nothing to watch
        return
    current = EngineCoreProc.__dict__.get("run_engine_core")
    target = current.__func__ if isinstance(current, staticmethod) else current
    if target is run_engine_core_watched or target is None:
        return
    _original = target
    EngineCoreProc.run_engine_core = staticmethod(run_engine_core_watched)


def run_engine_core_watched(*args: Any, **kwargs: Any) -> Any:
    """vLLM's engine-core target, with a watchdog on the parent started first."""
    start_watchdog(os.getppid())
    target = _original
    if target is None:  # a spawned child: vLLM imported afresh, its target untouched
        from vllm.v1.engine.core import EngineCoreProc

        target = EngineCoreProc.run_engine_core
    return target(*args, **kwargs)


def start_watchdog(parent: int, on_orphaned: Callable[[], None] | None = None) -> threading.Thread:
    """A daemon thread that calls ``on_orphaned`` (default: :func:`end_this_process`) once this
    process's parent is no longer ``parent``."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(POLL_S)
        (on_orphaned or end_this_process)()

    thread = threading.Thread(target=watch, name="wasp-vllm-lifeline", daemon=True)
    thread.start()
    return thread


def end_this_process() -> None:
    """Kill this process's descendants (an executor's workers), then exit at once: the run that
    needed them is gone, and a clean shutdown would wait for a front end that will not answer."""
    try:
        import psutil

        for child in psutil.Process().children(recursive=True):
            with contextlib.suppress(psutil.Error):  # it may have ended meanwhile
                child.kill()
    except ImportError:  # vLLM requires psutil; without it, the process itself still ends
        pass
    os._exit(1)
