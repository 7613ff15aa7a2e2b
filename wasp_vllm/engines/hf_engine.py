"""transformers engine: batched ``generate`` with left padding.

Serves what vLLM lacks (encoder-decoders such as Flan-T5) and is the quick path
on a small CPU. Sampling is seeded per batch (transformers has no per-request
seed), so outputs are reproducible for the same prompts, seeds and batch size.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from wasp_vllm.engines.base import Completion, GenerationParams, chat_prompt, truncate_at_stop
from wasp_vllm.engines.chat_templates import ensure_chat_template
from wasp_vllm.engines.devices import gpu_available, model_dtype, torch_device
from wasp_vllm.engines.registry import ResolvedPLM

log = logging.getLogger(__name__)


class HFEngine:
    """A PLM run with ``transformers`` on CUDA when present, else CPU."""

    def __init__(
        self, plm: ResolvedPLM, *, batch_size: int, device: str | None = None, dtype: str = "auto"
    ) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoModelForSeq2SeqLM, AutoTokenizer

        self.name = plm.name
        self.chat = plm.chat
        self.seq2seq = plm.seq2seq
        self.batch_size = batch_size
        self.device = torch_device(device)
        self._torch = torch
        self._tokenizer = AutoTokenizer.from_pretrained(
            plm.path, padding_side="left", trust_remote_code=plm.trust_remote_code
        )
        ensure_chat_template(self._tokenizer, plm.name)
        if self._tokenizer.pad_token is None:
            self._tokenizer.pad_token = self._tokenizer.eos_token
        auto = AutoModelForSeq2SeqLM if plm.seq2seq else AutoModelForCausalLM
        self._model = auto.from_pretrained(
            plm.path,
            dtype=getattr(torch, model_dtype(dtype, self.device)),
            trust_remote_code=plm.trust_remote_code,
        ).to(self.device)  # type: ignore[arg-type]
        self._model.eval()
        log.debug("loaded hf engine %s on %s", self.name, self.device)

    def stats(self) -> dict[str, Any]:
        """The engine's public facts for the run manifest: the number type of the weights, the device."""
        return {"engine": "hf", "dtype": str(self._model.dtype).removeprefix("torch."), "device": self.device}

    def format_prompt(self, prompt: str) -> str:
        return chat_prompt(self._tokenizer, prompt) if self.chat else prompt

    def generate(
        self, prompts: Sequence[str], seeds: Sequence[int], params: GenerationParams
    ) -> list[Completion]:
        if len(prompts) != len(seeds):
            raise ValueError("one seed per prompt is required")
        out: list[Completion] = []
        for start in range(0, len(prompts), self.batch_size):
            stop = start + self.batch_size
            out.extend(self._generate_batch(prompts[start:stop], seeds[start], params))
        return out

    def _generate_batch(
        self, prompts: Sequence[str], seed: int, params: GenerationParams
    ) -> list[Completion]:
        torch = self._torch
        texts = [self.format_prompt(p) for p in prompts]
        # Chat templates already hold the BOS token; adding another shifts the model off-distribution.
        enc = self._tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=not self.chat)
        enc = enc.to(self.device)
        torch.manual_seed(int(seed))
        with torch.inference_mode():
            gen = self._model.generate(
                **enc,
                do_sample=True,
                temperature=params.temperature,
                top_p=params.top_p,
                top_k=params.top_k,  # 0 = off, as in transformers
                max_new_tokens=params.max_new_tokens,
                min_new_tokens=params.min_new_tokens,
                stop_strings=list(params.stop) or None,
                tokenizer=self._tokenizer,
                pad_token_id=self._tokenizer.pad_token_id,
                return_dict_in_generate=True,
            )
        # An encoder-decoder's output opens with the decoder's start token, which no step wrote.
        new_tokens = gen.sequences[:, 1:] if self.seq2seq else gen.sequences[:, enc["input_ids"].shape[1] :]
        written = new_tokens != self._tokenizer.pad_token_id
        results = []
        for i, row in enumerate(new_tokens):
            ids = row[written[i]].tolist()
            text = str(self._tokenizer.decode(ids, skip_special_tokens=True))
            results.append(Completion(truncate_at_stop(text, params.stop), len(ids)))
        return results

    def close(self) -> None:
        self._model = None
        if gpu_available():
            self._torch.cuda.empty_cache()
