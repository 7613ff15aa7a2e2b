"""Generation backends behind one interface, and the factory that picks one."""

from __future__ import annotations

from typing import Literal

from wasp_vllm.engines.base import Completion, Engine, GenerationParams
from wasp_vllm.engines.registry import PRESETS, ModelError, ResolvedPLM, resolve_plm

EngineKind = Literal["auto", "vllm", "hf", "openai"]

__all__ = ["Completion", "Engine", "GenerationParams", "ModelError", "PRESETS", "make_engine", "parse_plm"]


def parse_plm(spec: str) -> tuple[str, str | None]:
    """Split ``name@http://host:port/v1`` into (model, endpoint); plain names have no endpoint."""
    if "@" in spec:
        model, url = spec.split("@", 1)
        if not url.startswith(("http://", "https://")):
            raise ModelError(f"endpoint of PLM {model!r} must be an http(s) URL")
        return model, url
    return spec, None


def make_engine(spec: str, kind: EngineKind = "auto", *, seed: int = 0, **options: object) -> Engine:
    """Build the engine for one PLM spec (a preset, a model directory, or model@endpoint)."""
    model, url = parse_plm(spec)
    if url is not None or kind == "openai":
        if url is None:
            raise ModelError(f"the openai engine needs an endpoint: pass {model}@http://host:8000/v1")
        from wasp_vllm.engines.openai_engine import OpenAIEngine

        preset = PRESETS.get(model)  # a served preset keeps its chat template
        return OpenAIEngine(model, url, name=model, chat=bool(preset and preset.chat))
    plm: ResolvedPLM = resolve_plm(model)
    from wasp_vllm.engines.vllm_engine import vllm_supports

    if kind == "vllm" and plm.seq2seq:
        raise ModelError(f"vLLM cannot serve {plm.name} (encoder-decoder); use --engine hf or auto")
    if kind == "vllm" or (kind == "auto" and vllm_supports(plm)):
        from wasp_vllm.engines.vllm_engine import VLLMEngine

        vllm_opts = {k: v for k, v in options.items() if k in _VLLM_OPTIONS}
        return VLLMEngine(plm, seed=seed, **vllm_opts)  # type: ignore[arg-type]
    from wasp_vllm.engines.hf_engine import HFEngine

    hf_opts = {k: v for k, v in options.items() if k in ("batch_size", "device")}
    return HFEngine(plm, **hf_opts)  # type: ignore[arg-type]


_VLLM_OPTIONS = ("max_model_len", "gpu_memory_utilization", "cpu_kv_cache_gib", "enforce_eager", "sleep_mode")
