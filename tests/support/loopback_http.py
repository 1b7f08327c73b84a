"""A loopback HTTP server that records every request and answers each the same way: a webhook
receiver for alerts, or a server that refuses (401, 503) for fault tests.

    with LoopbackRecorder(status=401, body={"status": {"error": "refused"}}) as server:
        ...  # point the code under test at server.url
        server.requests[0].headers.get("api-key")

``status`` may be changed while it runs; ``requests`` grows as requests arrive (any method).
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = ["LoopbackRecorder", "Recorded"]


@dataclass(frozen=True)
class Recorded:
    """One request as it arrived: method, path, headers, body."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        recorder = self.server.recorder
        with recorder.lock:
            recorder.requests.append(
                Recorded(
                    self.command,
                    self.path,
                    {k.lower(): v for k, v in self.headers.items()},
                    self.rfile.read(length),
                )
            )
        body = b"" if recorder.body is None else json.dumps(recorder.body).encode()
        self.send_response(recorder.status)
        if body:
            self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_PUT = do_POST = do_PATCH = do_DELETE = _answer

    def log_message(self, *args: object) -> None:
        pass


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    recorder: LoopbackRecorder


class LoopbackRecorder:
    """An HTTP server on 127.0.0.1 and a free port; use as a context manager."""

    def __init__(self, status: int = 200, body: Any = None) -> None:
        self.status, self.body = status, body
        self.requests: list[Recorded] = []
        self.lock = threading.Lock()
        self._server = _Server(("127.0.0.1", 0), _Handler)
        self._server.recorder = self
        self.port = int(self._server.server_address[1])
        self.url = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def json_bodies(self) -> list[Any]:
        """The JSON body of each request received so far."""
        with self.lock:
            return [r.json() for r in self.requests]

    def __enter__(self) -> LoopbackRecorder:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._server.shutdown()
        self._server.server_close()
