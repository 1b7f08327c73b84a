"""A loopback HTTP proxy in front of moto that can drop the answer to a request after the
store has done the work: the client sees a reset, the object exists — an ambiguous write."""

from __future__ import annotations

import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx

__all__ = ["FirstPutHold", "ResettingProxy"]

_HOP_HEADERS = {"connection", "keep-alive", "transfer-encoding", "host", "content-length"}


Fault = tuple[int, bytes]  # (HTTP status, XML body) answered instead of forwarding


class ResettingProxy:
    """Forwards every request to ``upstream``, misbehaving on request:

    - ``drop_answer(method, path)`` → True: forward, then close the connection unanswered;
    - ``fault(method, path)`` → ``(status, body)``: answer that, without forwarding;
    - ``strip_request_headers``: header names removed before forwarding (a store that
      ignores them, e.g. ``If-None-Match``);
    - ``refuse_request_headers``: header-name prefixes the store does not support: a request
      carrying one is answered 400 ``InvalidArgument`` "Unsupported header 'NAME' received
      for this API call." (Backblaze B2's answer to ``x-amz-checksum-*``), not forwarded.

    ``seen`` records ``(method, path, status or "dropped")`` per request.
    """

    def __init__(
        self,
        upstream: str,
        drop_answer: Callable[[str, str], bool] = lambda method, path: False,
        *,
        fault: Callable[[str, str], Fault | None] = lambda method, path: None,
        strip_request_headers: tuple[str, ...] = (),
        refuse_request_headers: tuple[str, ...] = (),
    ) -> None:
        self.upstream = upstream.rstrip("/")
        self.drop_answer = drop_answer
        self.fault = fault
        self.strip = {h.lower() for h in strip_request_headers}
        self.refuse = tuple(h.lower() for h in refuse_request_headers)
        self.seen: list[tuple[str, str, Any]] = []
        self.lock = threading.Lock()
        self._client = httpx.Client(timeout=30)
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _forward(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                fault = proxy.fault(self.command, self.path) or proxy._refused(self.headers)
                if fault is not None:
                    with proxy.lock:
                        proxy.seen.append((self.command, self.path, fault[0]))
                    self.send_response(fault[0])
                    self.send_header("Content-Type", "application/xml")
                    self.send_header("Content-Length", str(len(fault[1])))
                    self.end_headers()
                    self.wfile.write(fault[1])
                    return
                headers = {
                    k: v
                    for k, v in self.headers.items()
                    if k.lower() not in _HOP_HEADERS | proxy.strip
                }
                response = proxy._client.request(
                    self.command, proxy.upstream + self.path, headers=headers, content=body
                )
                if proxy.drop_answer(self.command, self.path):
                    with proxy.lock:
                        proxy.seen.append((self.command, self.path, "dropped"))
                    self.close_connection = True
                    self.connection.shutdown(2)
                    return
                with proxy.lock:
                    proxy.seen.append((self.command, self.path, response.status_code))
                self.send_response(response.status_code)
                for name, value in response.headers.items():
                    # response.content is decoded: its Content-Encoding no longer holds
                    if name.lower() not in _HOP_HEADERS | {"content-encoding"}:
                        self.send_header(name, value)
                self.send_header("Content-Length", str(len(response.content)))
                self.end_headers()
                self.wfile.write(response.content)

            do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = do_PATCH = _forward  # noqa: N815

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def _refused(self, headers: Any) -> Fault | None:
        for name in headers:
            if self.refuse and name.lower().startswith(self.refuse):
                return 400, (
                    '<?xml version="1.0" encoding="UTF-8"?><Error><Code>InvalidArgument'
                    f"</Code><Message>Unsupported header '{name.lower()}' received for "
                    "this API call.</Message></Error>"
                ).encode()
        return None

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def __enter__(self) -> ResettingProxy:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._client.close()


class FirstPutHold:
    """A ``fault`` for ``ResettingProxy`` that only delays: the first PUT waits (up to 60 s)
    until ``release`` is set, then is forwarded. ``reached`` is set when it arrives, so a
    test can act while the client is held there (e.g. an output's conditional-write probe)."""

    def __init__(self) -> None:
        self.reached = threading.Event()
        self.release = threading.Event()

    def __call__(self, method: str, path: str) -> None:
        if method == "PUT" and not self.reached.is_set():
            self.reached.set()
            self.release.wait(60)
