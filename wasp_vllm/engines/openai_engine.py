"""Any OpenAI-compatible endpoint: a `vllm serve` fleet or a hosted API, with replicas.

One PLM may be served by several replicas (``name@URL1|URL2``).  Requests go out concurrently,
each with its own seed, at most ``concurrency`` in flight per replica; each request takes the
least-loaded healthy replica.  A request that fails (time-out, connection error, 5xx or 429) is
sent again, to another replica when there is one.  A replica that fails ``max_failures`` times in a
row is taken out for good and its requests go to the others; only when every replica is out does a
call fail (the pipeline then drops the PLM, as for any engine that keeps failing).  Each request's
completion is returned exactly once, in the order of the prompts.

"In a row" counts incidents, not requests: when a server dies, the requests it held all fail at
once; they count as one failure, and the replica then gets one probe request at a time, after a
back-off (1 s, 2 s, 4 s, ...), until a probe succeeds (the replica is healthy again) or the streak
reaches ``max_failures``.  A lone replica therefore rides out a short hiccup as the old per-request
retries did.

Base models use ``/completions``; chat models use ``/chat/completions`` so the server applies the
model's chat template, with a task prompt's trailing quote sent as the start of the assistant's
answer (vLLM's ``continue_final_message``), as the in-process engines do.  ``top_k`` and
``min_tokens`` are vLLM extensions of the API.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple

import httpx

from wasp_vllm.engines.base import Completion, GenerationParams, split_answer_prefill, truncate_at_stop

log = logging.getLogger(__name__)

#: Longest back-off before a failing replica gets its next probe request.
MAX_BACKOFF_S = 30.0


Outcome = Literal["ok", "failed", "rejected"]


class EndpointError(RuntimeError):
    """The endpoint (every replica of it) failed after all retries."""


class _Retryable(Exception):
    """An answer worth sending again (5xx, 429, or not the JSON we expect)."""


@dataclass
class Replica:
    """One endpoint of a served PLM and what it has done; changed only under the engine's lock."""

    url: str
    limit: int  # requests in flight at most
    in_flight: int = 0
    requests: int = 0  # sent
    completed: int = 0
    failures: int = 0
    streak: int = 0  # failure incidents in a row (0: healthy)
    incident: int = 0  # bumped at each counted failure; a request remembers the value it was sent at
    probing: bool = False  # a suspect replica gets one request at a time
    retry_at: float = 0.0  # monotonic time before which a suspect replica gets no request
    out: bool = False

    def ready(self, now: float) -> bool:
        if self.out:
            return False
        if self.streak == 0:
            return self.in_flight < self.limit
        return not self.probing and now >= self.retry_at

    def stats(self) -> dict[str, Any]:
        return {
            "url": self.url,
            "requests": self.requests,
            "completed": self.completed,
            "failures": self.failures,
            "out": self.out,
        }


class _Ticket(NamedTuple):
    """One request's hold on a replica: which one, the incident count it was sent at, whether a probe."""

    replica: Replica
    incident: int
    probe: bool


@dataclass(frozen=True)
class RetryPolicy:
    """How hard a client tries: per-request timeout, retries per replica, and when a replica that
    keeps failing is taken out (``max_failures`` in a row; back-off doubling from ``backoff_s``)."""

    timeout_s: float = 120.0
    retries: int = 3
    max_failures: int = 3
    backoff_s: float = 1.0


class OpenAIEngine:
    """Completions (or chat completions, ``chat=True``) of one served model over its replicas."""

    def __init__(
        self,
        model: str,
        base_url: str | Sequence[str],
        *,
        name: str | None = None,
        api_key: str | None = None,
        concurrency: int = 16,
        chat: bool = False,
        policy: RetryPolicy = RetryPolicy(),
    ) -> None:
        urls = [base_url] if isinstance(base_url, str) else list(base_url)
        if not urls:
            raise ValueError("an openai engine needs at least one endpoint")
        self.name = name or model
        self.chat = chat
        self.model = model
        self.replicas = [Replica(u.rstrip("/"), concurrency) for u in urls]
        self.base_url = self.replicas[0].url
        self.concurrency = concurrency
        self.policy = policy
        self._retried = 0
        self._lock = threading.Condition()
        key = api_key or os.environ.get("OPENAI_API_KEY", "EMPTY")
        # Idle connections expire before the server's keep-alive does (uvicorn's, vLLM's server
        # included: 5 s, httpx's default too): a request on one the server is closing at that
        # moment fails, and a healthy replica would be counted a failure between two rounds.
        limits = httpx.Limits(max_connections=concurrency * len(urls) + 4, keepalive_expiry=2.0)
        self._client = httpx.Client(
            timeout=policy.timeout_s, limits=limits, headers={"Authorization": f"Bearer {key}"}
        )

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

    # --- choosing and releasing a replica (all under the lock) ---------------------------------

    def _acquire(self) -> _Ticket:
        """The least-loaded ready replica (a due probe first); waits while none is ready."""
        with self._lock:
            while True:
                live = [r for r in self.replicas if not r.out]
                if not live:
                    raise EndpointError(f"every replica of {self.name} is out: {self._describe()}")
                now = time.monotonic()
                ready = [r for r in live if r.ready(now)]
                if ready:
                    r = min(ready, key=lambda r: (r.streak == 0, r.in_flight / r.limit, r.requests))
                    r.in_flight += 1
                    r.requests += 1
                    r.probing = r.streak > 0
                    return _Ticket(r, r.incident, r.probing)
                due = [r.retry_at - now for r in live if r.streak and not r.probing]
                self._lock.wait(timeout=max(0.01, min(due)) if due else None)

    def _release(self, ticket: _Ticket, outcome: Outcome) -> None:
        """Count the outcome; a failure of a request sent since the last counted one extends the streak."""
        r = ticket.replica
        with self._lock:
            r.in_flight -= 1
            if ticket.probe:
                r.probing = False
            if outcome == "ok":
                r.completed += 1
                r.streak = 0
            elif outcome == "failed":
                r.failures += 1
                if ticket.incident == r.incident and not r.out:
                    self._count_incident(r)
            self._lock.notify_all()

    def _count_incident(self, r: Replica) -> None:
        r.incident += 1
        r.streak += 1
        r.retry_at = time.monotonic() + min(self.policy.backoff_s * 2 ** (r.streak - 1), MAX_BACKOFF_S)
        if r.streak >= self.policy.max_failures:
            r.out = True
            log.warning("%s: replica %s taken out after %d failures in a row", self.name, r.url, r.streak)

    def _describe(self) -> str:
        return ", ".join(f"{r.url} ({r.failures} failures)" for r in self.replicas)

    # --- one request -----------------------------------------------------------------------------

    def _post(self, r: Replica, route: str, body: dict, params: GenerationParams) -> Completion:
        resp = self._client.post(f"{r.url}{route}", json=body)
        if resp.status_code == 429 or resp.status_code >= 500:
            raise _Retryable(f"HTTP {resp.status_code}")
        if resp.status_code >= 400:  # the request itself is wrong: every replica would say so
            raise EndpointError(
                f"endpoint {r.url} refused a request for model {self.model}: HTTP {resp.status_code} "
                f"{resp.text[:200]}"
            )
        try:
            data = resp.json()
            choice = data["choices"][0]
            text = choice["message"]["content"] if self.chat else choice["text"]
            n_tokens = int(data.get("usage", {}).get("completion_tokens", 0))
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            raise _Retryable(f"unexpected answer ({type(exc).__name__})") from None
        return Completion(truncate_at_stop(text or "", params.stop), n_tokens)

    def _request(self, prompt: str, seed: int, params: GenerationParams) -> Completion:
        route, body = self._body(prompt, seed, params)
        attempts = (self.policy.retries + 1) * len(self.replicas)
        for attempt in range(1, attempts + 1):
            ticket = self._acquire()
            try:
                completion = self._post(ticket.replica, route, body, params)
            except (httpx.TransportError, _Retryable) as exc:
                self._release(ticket, "failed")
                log.debug("%s: %s failed (%s), attempt %d", self.name, ticket.replica.url, exc, attempt)
                continue
            except BaseException:
                self._release(ticket, "rejected")  # a refused request: not the replica's fault
                raise
            self._release(ticket, "ok")
            if attempt > 1:
                with self._lock:
                    self._retried += 1
            return completion
        raise EndpointError(
            f"endpoint of {self.name} failed for model {self.model} after {attempts} attempts: "
            f"{self._describe()}"
        )

    # --- the engine interface ----------------------------------------------------------------

    def generate(
        self, prompts: Sequence[str], seeds: Sequence[int], params: GenerationParams
    ) -> list[Completion]:
        if len(prompts) != len(seeds):
            raise ValueError("one seed per prompt is required")
        if not prompts:
            return []
        workers = min(len(prompts), self.concurrency * len(self.replicas))
        with ThreadPoolExecutor(max_workers=workers) as pool:
            futures = [pool.submit(self._request, p, s, params) for p, s in zip(prompts, seeds, strict=True)]
            return [f.result() for f in futures]

    def stats(self) -> dict[str, Any]:
        """Per-replica counters for the run manifest (public: counts of requests, no text)."""
        with self._lock:
            return {
                "model": self.model,
                "retried": self._retried,
                "replicas": [r.stats() for r in self.replicas],
            }

    def close(self) -> None:
        self._client.close()
