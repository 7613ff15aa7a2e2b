"""The real backends of a run (one engine per PLM and the sentence embedder), and what else a run
may be handed beside its settings (:class:`Collaborators`).

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
from wasp_vllm.pipeline.policy import DEFAULT_POLICY, RoundPolicy


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


@dataclass(frozen=True)
class Collaborators:
    """What ``wasp_vllm.generate`` may be handed beside the run's settings, as the benchmark
    harness, the audit and tests do (a user's run needs none of it).

    ``backends``: engines and embedder in place of the real ones (None: :func:`default_backends`).
    ``policy``: a round policy in place of the paper's (:mod:`wasp_vllm.pipeline.policy`; never a
    setting: a variant becomes an option only once the adoption rule takes it).
    ``record_throughput``: whether the run's round-0 speed is kept for later plans (an audit's run
    keeps nothing; a ``--noise-seed`` run never does).
    """

    backends: Backends | None = None
    policy: RoundPolicy = DEFAULT_POLICY
    record_throughput: bool = True


def default_backends(cfg: RunConfig) -> Backends:
    return Backends(default_engine_factory, LazyEmbedder(cfg.embedder))
