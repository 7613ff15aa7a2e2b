"""The real backends of a run (one engine per PLM and the sentence embedder), and what else a run
may be handed beside its settings (:class:`Collaborators`).

:class:`~wasp_vllm.pipeline.Run` takes its backends as arguments; :func:`default_backends` is the
one place the command line and the Python API get the real ones (tests of those entry points
replace this one function).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from wasp_vllm.config import RunConfig
from wasp_vllm.engines import Engine, make_engine
from wasp_vllm.engines.options import EngineOptions
from wasp_vllm.engines.registry import ModelError
from wasp_vllm.pipeline.estimate import engine_kind
from wasp_vllm.pipeline.policy import DEFAULT_POLICY, RoundPolicy

log = logging.getLogger(__name__)

#: ``engine_factory(plm_spec, cfg) -> Engine``: how a run gets one engine per PLM.
EngineFactory = Callable[[str, Any], Engine]


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


@dataclass
class RunEngines:
    """The engines of one session of a run, one per active PLM: their start-up and shut-down are
    timed into ``timings``; at close each engine's public facts (number type, device, a served
    PLM's requests per replica) are kept in ``stats``, and which engine served each PLM in ``kinds``."""

    factory: EngineFactory
    timings: dict[str, float]
    engines: dict[str, Engine] = field(default_factory=dict)
    stats: dict[str, dict[str, Any]] = field(default_factory=dict)
    kinds: dict[str, str] = field(default_factory=dict)

    def open(self, names: Sequence[str], cfg: RunConfig) -> None:
        for name in names:
            start = time.perf_counter()
            try:
                self.engines[name] = self._load(name, cfg)
            finally:
                self._add(f"startup:{name}", start)
            self.kinds[name] = engine_kind(self.engines[name])

    def _load(self, name: str, cfg: RunConfig) -> Engine:
        try:
            return self.factory(name, cfg)
        except ModelError:
            raise
        except Exception as exc:  # noqa: BLE001 - a model that passed the cheap checks but will not load
            raise ModelError(f"PLM {name} could not be loaded ({type(exc).__name__}); see the log") from exc

    def close(self) -> None:
        for name, engine in self.engines.items():
            stats = getattr(engine, "stats", None)
            if callable(stats):
                self.stats[name] = stats()
            start = time.perf_counter()
            try:
                engine.close()
            except Exception:  # noqa: BLE001 - closing must not hide the real error
                log.debug("closing engine %s failed", engine.name, exc_info=True)
            finally:
                self._add(f"shutdown:{name}", start)
        self.engines.clear()

    def _add(self, stage: str, start: float) -> None:
        self.timings[stage] = self.timings.get(stage, 0.0) + time.perf_counter() - start
