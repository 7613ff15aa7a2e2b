"""A clock for what the default output shows: it stands still while private data is worked on.

The default-level output is published (docs/ARCHITECTURE.md, "What leaves a run"), and the time
spent on private data (embedding the records, voting) grows with the private file, so a progress
bar's elapsed time and ETA must not count it.  The CLI gives its progress bar a
:class:`PublicClock` (rich's ``Progress(get_time=...)``); the round loop wraps each private step in
:func:`private_work`, which stops that clock for the step's duration.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any


def _now() -> float:
    """The underlying clock (a module attribute, so a test can stand in for it)."""
    return time.monotonic()


class PublicClock:
    """Seconds of public work: a monotonic clock minus every stretch spent in :meth:`private_work`.

    rich reads the clock from its refresh thread while the loop starts and ends private stretches:
    each reading and each change of the state reads the time under one lock, so a reading is never
    made of a stale state and a fresh time (which would show a private stretch's length for a
    frame, the clock jumping back by it).
    """

    def __init__(self, source: Callable[[], float] | None = None) -> None:
        self._source = source
        self._lock = threading.Lock()
        self._paused = 0.0  # total length of the finished private stretches
        self._since: float | None = None  # start of the private stretch under way, if any

    def _read(self) -> float:
        return (self._source or _now)()

    def __call__(self) -> float:
        with self._lock:
            now = self._read() if self._since is None else self._since  # frozen while private
            return now - self._paused

    @contextmanager
    def private_work(self) -> Iterator[None]:
        """Stop the clock while the block runs (nested blocks count once)."""
        with self._lock:
            outer = self._since is None
            if outer:
                self._since = self._read()
        if not outer:
            yield
            return
        try:
            yield
        finally:
            with self._lock:
                assert self._since is not None
                self._paused += self._read() - self._since
                self._since = None


def private_work(progress: Any) -> AbstractContextManager[None]:
    """Stop ``progress``'s clock for a private step when it is a :class:`PublicClock` (rich keeps
    the clock a ``Progress`` was given as ``get_time``); nothing to stop otherwise."""
    clock = getattr(progress, "get_time", None)
    return clock.private_work() if isinstance(clock, PublicClock) else nullcontext()
