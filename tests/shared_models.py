"""Real models shared between slow tests (their fixtures are in conftest.py).

A real model that several slow tests only use (generate with, read distributions from) is loaded once
and lent to each: it is built by its first user and closed after the last test of a run of
consecutive users (conftest's ``pytest_runtest_teardown`` calls :func:`close_unwanted`).  pytest runs
the files in name order and the slow stage one test at a time, so users placed next to each other
share one start-up, and a vLLM engine's KV cache and threads are not held while later tests start
engines of their own.
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from typing import Any

_shared: dict[str, tuple[Any, Callable[[], None]]] = {}


def shared(name: str, build: Callable[[], Any], close: Callable[[Any], None]) -> Any:
    """The model ``name`` (a fixture's name), built on first use and kept until a test that does not
    ask for it."""
    if name not in _shared:
        model = build()
        _shared[name] = (model, lambda: close(model))
    return _shared[name][0]


def close_unwanted(wanted: set[str]) -> None:
    """Close every shared model whose fixture is not in ``wanted`` (the next test's fixtures)."""
    for name in [n for n in _shared if n not in wanted]:
        _, close = _shared.pop(name)
        close()
        gc.collect()


class KeptOpenForOtherTests:
    """A real engine lent to a run: the run's ``close()`` leaves it open for the next test that shares
    it (:func:`close_unwanted` closes it).  Everything else is the engine's own."""

    def __init__(self, engine: Any) -> None:
        self._engine = engine

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)

    def close(self) -> None:
        pass
