"""Any OpenAI-compatible endpoint: a `vllm serve` fleet or a hosted API.

Requests go out concurrently (bounded), each with its own seed, and are retried
with exponential back-off on time-outs and 5xx/429 answers.  Base models use
``/completions``; chat models use ``/chat/completions`` so the server applies the
model's chat template, with a task prompt's trailing quote sent as the start of
the assistant's answer (vLLM's ``continue_final_message``), as the in-process
engines do.  ``top_k`` and ``min_tokens`` are vLLM extensions of the API.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import httpx

from wasp_vllm.engines.base import Completion, GenerationParams, split_answer_prefill, truncate_at_stop

log = logging.getLogger(__name__)


class EndpointError(RuntimeError):
    """The endpoint failed after all retries."""


class OpenAIEngine:
    """Completions (or chat completions, ``chat=True``) against ``base_url`` for one served model."""

    def __init__(
        self,
        model: str,
        base_url: str,
        *,
        name: str | None = None,
        api_key: str | None = None,
        concurrency: int = 16,
        timeout_s: float = 120.0,
        retries: int = 3,
        chat: bool = False,
    ) -> None:
        self.name = name or model
        self.chat = chat
        self.model = model
        self.base_url = base_url.rstrip("/")
        self.concurrency = concurrency
        self.retries = retries
        key = api_key or os.environ.get("OPENAI_API_KEY", "EMPTY")
        self._client = httpx.Client(timeout=timeout_s, headers={"Authorization": f"Bearer {key}"})

    def _body(self, prompt: str, seed: int, params: GenerationParams) -> tuple[str, dict]:
        body = {
            "model": self.model,
            "max_tokens": params.max_new_tokens,
            "min_tokens": params.min_new_tokens,
            "temperature": params.temperature,
            "top_p": params.top_p,
            "top_k": params.top_k or -1,
            "seed": int(seed),
            "stop": list(params.stop) or None,
        }
        if not self.chat:
            return "/completions", body | {"prompt": prompt}
        question, prefill = split_answer_prefill(prompt)  # as chat_prompt does in-process
        messages = [{"role": "user", "content": question}]
        if prefill:
            messages.append({"role": "assistant", "content": prefill})
            body |= {"add_generation_prompt": False, "continue_final_message": True}
        return "/chat/completions", body | {"messages": messages}

    def _request(self, prompt: str, seed: int, params: GenerationParams) -> Completion:
        route, body = self._body(prompt, seed, params)
        for attempt in range(self.retries + 1):
            try:
                resp = self._client.post(f"{self.base_url}{route}", json=body)
                if resp.status_code == 429 or resp.status_code >= 500:
                    raise httpx.HTTPStatusError("retryable", request=resp.request, response=resp)
                resp.raise_for_status()
                data = resp.json()
                choice = data["choices"][0]
                text = choice["message"]["content"] if self.chat else choice["text"]
                n_tokens = int(data.get("usage", {}).get("completion_tokens", 0))
                return Completion(truncate_at_stop(text, params.stop), n_tokens)
            except (httpx.TransportError, httpx.HTTPStatusError) as exc:
                if attempt == self.retries:
                    raise EndpointError(
                        f"endpoint {self.base_url} failed for model {self.model} after "
                        f"{self.retries + 1} attempts: {type(exc).__name__}"
                    ) from None
                time.sleep(min(2**attempt, 30))
        raise AssertionError("unreachable")

    def generate(
        self, prompts: Sequence[str], seeds: Sequence[int], params: GenerationParams
    ) -> list[Completion]:
        if len(prompts) != len(seeds):
            raise ValueError("one seed per prompt is required")
        with ThreadPoolExecutor(max_workers=self.concurrency) as pool:
            futures = [pool.submit(self._request, p, s, params) for p, s in zip(prompts, seeds, strict=True)]
            return [f.result() for f in futures]

    def close(self) -> None:
        self._client.close()
