"""How an engine starts: the one place engine options are built from a run's settings.

The defaults of these options live in :class:`~wasp_vllm.config.EngineSettings` (with their help);
what depends on the machine (a GPU's share per engine) is decided here, once.
"""

from __future__ import annotations

from dataclasses import dataclass

from wasp_vllm.config import EngineKind, EngineSettings, RunConfig
from wasp_vllm.engines.devices import gpu_available, model_dtype

#: Share of one GPU that vLLM engines take together (the rest is left to the embedder and FAISS).
GPU_SHARE = 0.9
#: Share one engine takes in sleep mode, where the PLMs take turns at the whole card.
SLEEP_MODE_SHARE = 0.85


@dataclass(frozen=True)
class EngineOptions:
    """Everything an engine needs besides its model; built with :meth:`from_settings`."""

    kind: EngineKind
    seed: int
    max_model_len: int
    batch_size: int
    cpu_kv_cache_gib: int
    enforce_eager: bool | None
    sleep_mode: bool
    gpu_memory_utilization: float
    dtype: str  # resolved (``devices.model_dtype``): never 'auto'

    @classmethod
    def from_settings(cls, engines: EngineSettings, *, seed: int, plms: int) -> EngineOptions:
        """The options of each of a run's ``plms`` engines; ``seed`` is the run's sampling seed."""
        args = engines.engine_args
        share = args.gpu_memory_utilization
        if share is None:
            # K engines share one GPU by splitting its memory, or take turns at most of it.
            share = SLEEP_MODE_SHARE if args.sleep_mode else round(GPU_SHARE / plms, 3)
        return cls(
            kind=engines.engine,
            seed=seed,
            max_model_len=args.max_model_len,
            batch_size=args.batch_size,
            cpu_kv_cache_gib=args.cpu_kv_cache_gib,
            enforce_eager=args.enforce_eager,
            sleep_mode=args.sleep_mode and gpu_available(),
            gpu_memory_utilization=share,
            dtype=model_dtype(args.dtype),
        )

    @classmethod
    def from_config(cls, cfg: RunConfig) -> EngineOptions:
        """The options of a whole run's engines: its engine settings, its seed and its PLM count."""
        return cls.from_settings(cfg.engines, seed=cfg.seed, plms=len(cfg.plms))
