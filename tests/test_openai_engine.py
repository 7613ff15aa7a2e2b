"""The HTTP client for served PLMs, against a local stand-in endpoint (no model behind it).

The stand-in records each request body and answers in the OpenAI response format; it tests
what the client sends and how it retries, not any generation.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from wasp_vllm.engines import ModelError, make_engine, parse_plm
from wasp_vllm.engines.base import GenerationParams
from wasp_vllm.engines.openai_engine import EndpointError, OpenAIEngine, RetryPolicy

FAST = RetryPolicy(backoff_s=0.01)  # replicas come back within the test's time


class StandInEndpoint:
    """``fail_first`` requests get a 503, then every request is answered.

    For the replica tests: ``status`` answers every request with that HTTP status instead;
    ``die_after`` drops the connection without an answer from that many requests on (a crashed
    server); ``delay_s`` holds each answer that long; ``peak`` is the most requests it held at once.
    """

    def __init__(
        self, fail_first: int = 0, *, status: int | None = None, die_after: int | None = None,
        delay_s: float = 0.0,
    ) -> None:  # fmt: skip
        self.requests: list[tuple[str, dict]] = []
        self.answered: list[int] = []  # seeds answered with a sample
        self.fail_first = fail_first
        self.status, self.die_after, self.delay_s = status, die_after, delay_s
        self.peak = 0
        self._holding = 0
        self._lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's naming
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with outer._lock:
                    outer.requests.append((self.path, body))
                    n = len(outer.requests)
                    outer._holding += 1
                    outer.peak = max(outer.peak, outer._holding)
                released: list[int] = []

                def release() -> None:
                    # before the first byte of the answer: the client may send its next request as
                    # soon as it reads this one, and must not find it still counted as held
                    if not released:
                        released.append(1)
                        with outer._lock:
                            outer._holding -= 1

                try:
                    outer._answer(self, body, n, release)
                finally:
                    release()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        poll = {"poll_interval": 0.05}  # a quick shutdown
        serve = threading.Thread(target=self.server.serve_forever, kwargs=poll, daemon=True)
        serve.start()

    def _answer(
        self, handler: BaseHTTPRequestHandler, body: dict, n: int, release: Callable[[], None]
    ) -> None:
        time.sleep(self.delay_s)
        release()
        if self.die_after is not None and n > self.die_after:
            handler.close_connection = True  # no answer at all: the client sees the connection drop
            return
        status = self.status or (503 if n <= self.fail_first else 200)
        if status != 200:
            handler.send_response(status)
            handler.send_header("Content-Length", "0")
            handler.end_headers()
            return
        text = f'sample for seed {body["seed"]}" and the rest'
        choice: dict[str, Any] = {"message": {"content": text}} if "messages" in body else {"text": text}
        if body.get("logprobs") is True:  # chat: one entry per token
            choice["logprobs"] = {
                "content": [{"token": "a", "logprob": -1.0}, {"token": "b", "logprob": -3.0}]
            }
        elif body.get("logprobs") == 0:  # completions: the sampled tokens' log-probabilities
            choice["logprobs"] = {"token_logprobs": [-0.5, -1.5, -4.0], "top_logprobs": None}
        payload = json.dumps({"choices": [choice], "usage": {"completion_tokens": 5}}).encode()
        with self._lock:  # before the answer: once the client has it, the test may read the count
            self.answered.append(int(body["seed"]))
        handler.send_response(200)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(payload)))
        handler.end_headers()
        handler.wfile.write(payload)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture()
def endpoint():
    server = StandInEndpoint()
    yield server
    server.close()


PARAMS = GenerationParams(max_new_tokens=32, min_new_tokens=4, top_k=50, stop=('"',))


def test_base_model_gets_completions_with_seed_and_sampling(endpoint):
    engine = OpenAIEngine("gemma3", endpoint.url)
    out = engine.generate(['Write a review: "', "Another"], [7, 8], PARAMS)
    assert [c.text for c in out] == ["sample for seed 7", "sample for seed 8"]  # cut at the stop
    route, body = next(r for r in endpoint.requests if r[1]["seed"] == 7)  # requests run concurrently
    assert route == "/v1/completions" and body["prompt"] == 'Write a review: "'
    assert (body["top_k"], body["min_tokens"], body["max_tokens"], body["stop"]) == (50, 4, 32, ['"'])


def test_chat_preset_gets_its_template_with_the_quote_as_answer_prefill(endpoint):
    engine = make_engine(f"smollm2@{endpoint.url}")  # smollm2 is a chat preset
    assert engine.generate(['Write a review: "'], [3], PARAMS)[0].text == "sample for seed 3"
    route, body = endpoint.requests[0]
    assert route == "/v1/chat/completions"
    assert body["messages"] == [
        {"role": "user", "content": "Write a review:"},
        {"role": "assistant", "content": '"'},
    ]
    assert body["continue_final_message"] is True and body["add_generation_prompt"] is False
    assert not make_engine(f"gemma3@{endpoint.url}").chat


def test_transient_errors_are_retried_then_reported():
    flaky = StandInEndpoint(fail_first=1)
    try:
        engine = OpenAIEngine("m", flaky.url, policy=RetryPolicy(retries=1, backoff_s=0.01))
        assert engine.generate(["p"], [1], PARAMS)[0].text == "sample for seed 1"
        flaky.fail_first = 10**6
        with pytest.raises(EndpointError, match="after 2 attempts"):
            engine.generate(["p"], [2], PARAMS)
    finally:
        flaky.close()


# --- replicas: name@URL1|URL2 ------------------------------------------------------------------


@pytest.fixture()
def stand_ins():
    """Stand-ins made on demand, all closed at the end."""
    made: list[StandInEndpoint] = []

    def make(**kwargs: object) -> StandInEndpoint:
        made.append(StandInEndpoint(**kwargs))  # type: ignore[arg-type]
        return made[-1]

    yield make
    for server in made:
        server.close()


def dead_url() -> str:
    """An endpoint nobody listens on (connection refused), like a server that was killed."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/v1"


def seeds_of(out: list) -> list[int]:
    return [int(c.text.removeprefix("sample for seed ")) for c in out]


def replica(engine: OpenAIEngine, i: int) -> dict:
    return engine.stats()["replicas"][i]


def test_parse_plm_reads_replicas_separated_by_pipes():
    assert parse_plm("gemma3") == ("gemma3", None)
    assert parse_plm("m@http://a:1/v1") == ("m", ["http://a:1/v1"])
    assert parse_plm("m@http://a:1/v1|https://b:2/v1") == ("m", ["http://a:1/v1", "https://b:2/v1"])
    for bad in ("m@http://a:1/v1|ftp://b/v1", "m@http://a:1/v1|http://a:1/v1", "@http://a:1/v1", "m@"):
        with pytest.raises(ModelError):
            parse_plm(bad)


def test_requests_spread_over_replicas_bounded_per_replica_and_in_order(stand_ins):
    a, b = stand_ins(delay_s=0.02), stand_ins(delay_s=0.02)
    engine = make_engine(f"gemma3@{a.url}|{b.url}")
    assert isinstance(engine, OpenAIEngine) and len(engine.replicas) == 2
    engine.concurrency = 4
    for r in engine.replicas:
        r.limit = 4
    seeds = list(range(100, 140))
    out = engine.generate(["p"] * len(seeds), seeds, PARAMS)
    assert seeds_of(out) == seeds  # each completion once, in the order of the prompts
    assert sorted(a.answered + b.answered) == seeds  # nothing sent twice
    assert len(a.answered) >= 10 and len(b.answered) >= 10  # least-loaded: both did their share
    assert a.peak <= 4 and b.peak <= 4  # at most `concurrency` in flight per replica
    stats = engine.stats()
    assert stats["model"] == "gemma3" and stats["retried"] == 0
    assert [(r["requests"], r["completed"], r["failures"], r["out"]) for r in stats["replicas"]] == [
        (len(a.answered), len(a.answered), 0, False),
        (len(b.answered), len(b.answered), 0, False),
    ]


@pytest.mark.parametrize("failure", ["refused", "503", "dies"])
def test_a_failing_replica_is_taken_out_and_its_requests_go_to_the_other(stand_ins, failure):
    good = stand_ins(delay_s=0.01)
    bad_url = {
        "refused": dead_url,
        "503": lambda: stand_ins(status=503).url,
        "dies": lambda: stand_ins(die_after=2, delay_s=0.01).url,
    }[failure]()
    engine = OpenAIEngine("m", [bad_url, good.url], concurrency=4, policy=FAST)
    seeds = list(range(30))
    out = engine.generate(["p"] * 30, seeds, PARAMS)
    assert seeds_of(out) == seeds
    bad, ok = replica(engine, 0), replica(engine, 1)
    assert bad["out"] and bad["failures"] >= engine.policy.max_failures
    assert bad["completed"] + ok["completed"] == 30 and ok["failures"] == 0
    assert engine.stats()["retried"] >= 1
    # The replica stays out: the next call goes to the good one only.
    sent_before = bad["requests"]
    assert seeds_of(engine.generate(["p"] * 5, [100, 101, 102, 103, 104], PARAMS)) == [
        100,
        101,
        102,
        103,
        104,
    ]
    assert replica(engine, 0)["requests"] == sent_before


def test_the_call_fails_only_when_every_replica_is_out(stand_ins):
    a, b = stand_ins(status=503), stand_ins(status=502)
    engine = OpenAIEngine("m", [a.url, b.url], concurrency=2, policy=FAST)
    with pytest.raises(EndpointError, match="out|failed"):
        engine.generate(["p"] * 6, list(range(6)), PARAMS)
    assert all(r["out"] for r in engine.stats()["replicas"])
    started = time.perf_counter()
    with pytest.raises(EndpointError, match="every replica of m is out"):
        engine.generate(["p"], [1], PARAMS)  # a later call fails at once
    assert time.perf_counter() - started < 1.0


def test_a_hiccup_of_a_lone_replica_is_ridden_out_and_forgiven(stand_ins):
    flaky = stand_ins(fail_first=2)
    engine = OpenAIEngine("m", flaky.url, concurrency=1, policy=FAST)
    assert seeds_of(engine.generate(["p"] * 3, [7, 8, 9], PARAMS)) == [7, 8, 9]
    r = replica(engine, 0)
    assert (r["failures"], r["completed"], r["out"]) == (2, 3, False)
    assert engine.replicas[0].streak == 0  # a success resets the streak


def test_a_refused_request_is_not_retried_nor_held_against_the_replica(stand_ins):
    a = stand_ins(status=400)
    engine = OpenAIEngine("m", a.url, policy=FAST)
    with pytest.raises(EndpointError, match="HTTP 400"):
        engine.generate(["p"], [1], PARAMS)
    assert len(a.requests) == 1
    assert replica(engine, 0) | {"url": ""} == {
        "url": "", "requests": 1, "completed": 0, "failures": 0, "out": False,
    }  # fmt: skip
