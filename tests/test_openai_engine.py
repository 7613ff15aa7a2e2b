"""The HTTP client for served PLMs, against a local stand-in endpoint (no model behind it).

The stand-in records each request body and answers in the OpenAI response format; it tests
what the client sends and how it retries, not any generation.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from wasp_vllm.engines import make_engine
from wasp_vllm.engines.base import GenerationParams
from wasp_vllm.engines.openai_engine import EndpointError, OpenAIEngine


class StandInEndpoint:
    """``fail_first`` requests get a 503, then every request is answered."""

    def __init__(self, fail_first: int = 0) -> None:
        self.requests: list[tuple[str, dict]] = []
        self.fail_first = fail_first
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's naming
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.requests.append((self.path, body))
                if len(outer.requests) <= outer.fail_first:
                    self.send_response(503)
                    self.end_headers()
                    return
                text = f'sample for seed {body["seed"]}" and the rest'
                choice = {"message": {"content": text}} if "messages" in body else {"text": text}
                payload = json.dumps({"choices": [choice], "usage": {"completion_tokens": 5}}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

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
        engine = OpenAIEngine("m", flaky.url, retries=1)
        assert engine.generate(["p"], [1], PARAMS)[0].text == "sample for seed 1"
        flaky.fail_first = 10**6
        with pytest.raises(EndpointError, match="after 2 attempts"):
            engine.generate(["p"], [2], PARAMS)
    finally:
        flaky.close()
