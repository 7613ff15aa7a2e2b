"""Generation backends behind one interface, and the factory that picks one."""

from __future__ import annotations

from wasp_vllm.engines.base import Completion, Engine, GenerationParams
from wasp_vllm.engines.chatter import engine_messages
from wasp_vllm.engines.options import EngineKind, EngineOptions
from wasp_vllm.engines.registry import PRESETS, ModelError, ResolvedPLM, parse_plm, resolve_plm

__all__ = [
    "Completion",
    "Engine",
    "EngineKind",
    "EngineOptions",
    "GenerationParams",
    "ModelError",
    "PRESETS",
    "engine_messages",
    "make_engine",
    "parse_plm",
]


def make_engine(spec: str, options: EngineOptions | None = None) -> Engine:
    """Build the engine for one PLM spec (a preset, a model directory, or model@endpoint).

    ``options`` default to those of a run with default settings (:class:`~wasp_vllm.config.RunConfig`).
    """
    if options is None:
        from wasp_vllm.config import RunConfig

        options = EngineOptions.from_config(RunConfig())
    model, url = parse_plm(spec)
    if url is not None or options.kind == "openai":
        if url is None:
            raise ModelError(f"the openai engine needs an endpoint: pass {model}@http://host:8000/v1")
        from wasp_vllm.engines.openai_engine import OpenAIEngine

        preset = PRESETS.get(model)  # a served preset keeps its chat template
        return OpenAIEngine(model, url, name=model, chat=bool(preset and preset.chat))
    plm: ResolvedPLM = resolve_plm(model)
    from wasp_vllm.engines.vllm_engine import vllm_supports

    if options.kind == "vllm" and plm.seq2seq:
        raise ModelError(f"vLLM cannot serve {plm.name} (encoder-decoder); use --engine hf or auto")
    if options.kind == "vllm" or (options.kind == "auto" and vllm_supports(plm)):
        from wasp_vllm.engines.vllm_engine import VLLMEngine

        return VLLMEngine(plm, options)
    from wasp_vllm.engines.hf_engine import HFEngine

    return HFEngine(plm, batch_size=options.batch_size, dtype=options.dtype)
