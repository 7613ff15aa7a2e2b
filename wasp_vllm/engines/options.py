"""How an engine starts: the one place engine options are built from a run's settings.

The defaults of these options live in :class:`~wasp_vllm.config.RunConfig` (with their help);
what depends on the machine (a GPU's share per engine) is decided here, once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from wasp_vllm.config import RunConfig
from wasp_vllm.engines.devices import gpu_available

EngineKind = Literal["auto", "vllm", "hf", "openai"]
#: Share of one GPU that vLLM engines take together (the rest is left to the embedder and FAISS).
GPU_SHARE = 0.9
#: Share one engine takes in sleep mode, where the PLMs take turns at the whole card.
SLEEP_MODE_SHARE = 0.85


@dataclass(frozen=True)
class EngineOptions:
    """Everything an engine needs besides its model; built with :meth:`from_config`."""

    kind: EngineKind
    seed: int
    max_model_len: int
    batch_size: int
    cpu_kv_cache_gib: int
    enforce_eager: bool | None
    sleep_mode: bool
    gpu_memory_utilization: float

    @classmethod
    def from_config(cls, cfg: RunConfig) -> EngineOptions:
        share = cfg.gpu_memory_utilization
        if share is None:
            # K engines share one GPU by splitting its memory, or take turns at most of it.
            share = SLEEP_MODE_SHARE if cfg.sleep_mode else round(GPU_SHARE / len(cfg.plms), 3)
        return cls(
            kind=cfg.engine,
            seed=cfg.seed,
            max_model_len=cfg.max_model_len,
            batch_size=cfg.batch_size,
            cpu_kv_cache_gib=cfg.cpu_kv_cache_gib,
            enforce_eager=cfg.enforce_eager,
            sleep_mode=cfg.sleep_mode and gpu_available(),
            gpu_memory_utilization=share,
        )
