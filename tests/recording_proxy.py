"""A loopback HTTP proxy that records every request body it forwards (what a deployment receives)."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx


class RecordingProxy:
    """Forwards ``POST``/``GET`` on 127.0.0.1 to ``upstream``; ``requests`` holds (path, body, status)."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream.rstrip("/")
        self.requests: list[tuple[str, bytes, int]] = []
        self._lock = threading.Lock()
        self._client = httpx.Client(timeout=600, limits=httpx.Limits(max_connections=64))
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _forward(self, method: str) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                try:
                    resp = proxy._client.request(method, proxy.upstream + self.path, content=body,
                                                 headers={"Content-Type": "application/json"})  # fmt: skip
                    status, content = resp.status_code, resp.content
                except httpx.HTTPError as exc:
                    status, content = 502, str(exc).encode()
                with proxy._lock:
                    proxy.requests.append((self.path, body, status))
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(content)))
                self.end_headers()
                self.wfile.write(content)

            def do_POST(self) -> None:  # noqa: N802 - the http.server spelling
                self._forward("POST")

            def do_GET(self) -> None:  # noqa: N802
                self._forward("GET")

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> RecordingProxy:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._client.close()
