"""The real backends of a run: one engine per PLM and the sentence embedder.

:class:`~wasp_vllm.pipeline.Run` takes its backends as arguments; :func:`default_backends` is the
one place the command line and the Python API get the real ones (tests of those entry points
replace this one function).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from wasp_vllm.config import RunConfig
from wasp_vllm.engines import Engine, make_engine
from wasp_vllm.engines.options import EngineOptions
from wasp_vllm.pipeline.loop import EngineFactory


def default_engine_factory(name: str, cfg: RunConfig) -> Engine:
    return make_engine(name, EngineOptions.from_config(cfg))


class LazyEmbedder:
    """The sentence embedder, loaded on first use (a run resumed after its last round needs none)."""

    def __init__(self, spec: str) -> None:
        self.spec = spec
        self._embedder: Any = None

    def load(self) -> None:
        self._loaded()

    def _loaded(self) -> Any:
        if self._embedder is None:
            from wasp_vllm.engines.embedder import Embedder

            self._embedder = Embedder(self.spec)
        return self._embedder

    @property
    def name(self) -> str:
        return str(self._loaded().name)

    @property
    def dim(self) -> int:
        return int(self._loaded().dim)

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        return np.asarray(self._loaded().encode(texts))


@dataclass(frozen=True)
class Backends:
    engine_factory: EngineFactory
    embedder: Any


def default_backends(cfg: RunConfig) -> Backends:
    return Backends(default_engine_factory, LazyEmbedder(cfg.embedder))
