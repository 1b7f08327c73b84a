"""A small OpenAI-compatible ``POST /v1/embeddings`` server for tests and benchmarks.

Answers like the OpenAI embeddings API (https://platform.openai.com/docs/api-reference/
embeddings): ``{"object": "list", "data": [{"object": "embedding", "index": i,
"embedding": ...}], "model": ..., "usage": {"prompt_tokens": n, "total_tokens": n}}``, with
``encoding_format`` ``"float"`` (a JSON list) or ``"base64"`` (little-endian float32 bytes).
Errors use OpenAI's shape ``{"error": {"message", "type", "param", "code"}}``.

Vectors are deterministic: ``expected_vector(text, dims)``, so a test can check every
returned vector against its text. ``dimensions`` d ≤ the server's ``dims`` is honoured
(``expected_vector(text, d)``, which is the first d components of the same raw vector,
renormalized, as OpenAI's shortened embeddings are); a larger d is a 400.

Failure injection: ``script([fault, ...])`` (consumed one per request, in order) and
``fail_when(predicate)``. A fault is a dict with optional keys ``status`` (int),
``headers`` (dict), ``body`` (str or bytes; default an OpenAI-shaped error), ``delay_s``
(seconds before answering), ``reset`` (close the connection with a TCP RST, no answer) and
``after_work`` (with ``reset``: compute and count the answer first, then reset). A fault
with neither ``status`` nor ``reset`` only delays the normal answer.

Run standalone (benchmarks, and tests whose client runs in another process)::

    python -m tests.support.fake_openai --port 0 --dims 384
    # stdout: READY http://127.0.0.1:PORT/v1 ; on SIGTERM: one JSON line of counters
    python -m tests.support.fake_openai --port 0 --fail-texts-containing MARK --fail-status 503

Control endpoints (for a server in another process): ``GET /control/counters`` answers
``{"requests", "inputs", "log"}`` (the log as described for ``FakeEmbeddingServer``);
``POST /control/heal`` stops ``fail_texts_containing`` failures (``heal()``).
"""

from __future__ import annotations

import argparse
import base64
import collections
import hashlib
import json
import signal
import socket
import struct
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import numpy as np

__all__ = ["FakeEmbeddingServer", "expected_matrix", "expected_vector", "main"]

Fault = dict[str, Any]


def expected_matrix(texts: Sequence[str], dims: int = 384) -> np.ndarray:
    """Return the server's vectors for ``texts``: float32 ``(len(texts), dims)``, unit rows.

    Row i is derived from ``sha256(texts[i] as UTF-8)``: SHAKE-256 of that digest gives
    ``dims`` little-endian int16 values, scaled and L2-normalized. Vectorized: one numpy pass
    per batch.
    """
    if dims < 1:
        raise ValueError(f"dims must be at least 1, got {dims}")
    raw = b"".join(
        hashlib.shake_256(hashlib.sha256(t.encode("utf-8")).digest()).digest(2 * dims)
        for t in texts
    )
    matrix = np.frombuffer(raw, dtype="<i2").reshape(len(texts), dims).astype(np.float32)
    norms = np.linalg.norm(matrix, axis=1, keepdims=True)
    return matrix / np.where(norms == 0, 1, norms)


def expected_vector(text: str, dims: int = 384) -> np.ndarray:
    """Return the deterministic float32 unit vector (shape ``(dims,)``) served for ``text``."""
    return expected_matrix([text], dims)[0]


def _error_body(
    message: str, *, type_: str, code: str | None = None, param: str | None = None
) -> bytes:
    error = {"message": message, "type": type_, "param": param, "code": code}
    return json.dumps({"error": error}).encode()


class _Handler(BaseHTTPRequestHandler):
    """One connection; ``app`` is set on a per-server subclass."""

    app: FakeEmbeddingServer
    protocol_version = "HTTP/1.1"  # keep-alive: every answer carries Content-Length
    disable_nagle_algorithm = True  # headers and body in separate writes: no 40 ms stalls
    timeout = 60
    reset_on_finish = False

    def do_POST(self) -> None:  # noqa: N802 (http.server naming)
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length)
        if self.path.split("?")[0].rstrip("/") == "/control/heal":
            self.app.heal()
            return self.app._reply(self, 200, b'{"healed": true}')
        self.app._handle(self, raw)

    def do_GET(self) -> None:  # noqa: N802
        if self.path.split("?")[0].rstrip("/") == "/control/counters":
            with self.app.lock:
                body = {
                    "requests": self.app.requests,
                    "inputs": self.app.inputs,
                    "log": [dict(entry) for entry in self.app.log],
                }
            return self.app._reply(self, 200, json.dumps(body).encode())
        self.app._reply(self, 200, b'{"status": "ok"}')

    def finish(self) -> None:
        if self.reset_on_finish:  # TCP RST: SO_LINGER 0, then drop every reference
            linger = struct.pack("ii", 1, 0)
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, linger)
            self.wfile.close()
            self.rfile.close()
            self.connection.close()
            return
        super().finish()

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        pass  # quiet: tests read server.log instead


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # client went away (e.g. after a scripted reset): nothing to report


class FakeEmbeddingServer:
    """OpenAI-compatible embeddings server on loopback, in a daemon thread.

    Counters (read under ``lock`` or via ``counters()``): ``requests`` (POSTs received),
    ``inputs`` (texts embedded in answered or ``after_work`` requests), ``charged`` (a
    ``Counter``: how many times each text was embedded so, keyed by ``sha256(text)``
    hex; ``charged_texts()``) and ``log``, one dict
    per POST: ``idempotency_key``, ``n_inputs``, ``model``, ``status`` (int, or ``"reset"``),
    ``encoding_format``, ``dimensions``, ``authorization`` (bool: header present), ``at``
    (``time.monotonic()`` on arrival). No text is stored.

    :param dims: the model's native vector length.
    :param shuffle_index: answer ``data`` in reversed order (``index`` ≠ position).
    :param require_key: answer 401 unless ``Authorization: Bearer <require_key>``.
    :param reject_texts_containing: answer 400 (OpenAI-shaped, ``param: "input"``) to any
        request holding a text that contains this marker.
    :param accept_base64: if False, ``encoding_format: "base64"`` gets a 400 naming
        ``encoding_format`` (like servers that only speak floats).
    :param fail_texts_containing: answer ``fail_status`` (an OpenAI-shaped server error) to
        any request holding a text that contains this marker, until ``heal()``. Applies
        after ``script``/``fail_when`` faults; one of those that has no ``status`` (a
        delay: ``--delay-s``) still gets the failure, after its delay.
    :param fail_status: the HTTP status of those failures (default 503).
    :param reject_params: ``{param: message}``: a request carrying ``param`` gets a 400 with
        that message (a server that does not support ``dimensions``, say), every time.
    :param base64_refusal: answer ``encoding_format: "base64"`` with this status instead:
        400 (OpenAI-shaped, naming the field, as ``accept_base64=False``), 422 (a FastAPI
        validation body, ``{"detail": [{"loc": ["body", "encoding_format"], …}]}``) or 500
        (a plain-text "Internal Server Error", naming nothing).
    :param omit_first_index: leave ``index`` out of the first item of ``data`` (Gemini's
        OpenAI-compatible layer).
    :param key_header: with ``require_key``, the header that must carry the bare key
        (e.g. ``api-key``, Azure-style) instead of ``Authorization: Bearer``.
    :param max_inputs: answer 400 ("too many inputs") to requests of more inputs.

    Bad 200s (a vector that disagrees with the run, issue 22 item 3), each a real answer:

    :param change_dims_after: after this many answered embedding requests, every vector has
        ``changed_dims`` components (``expected_vector(text, changed_dims)``, whatever the
        request's ``dimensions``): a server whose default length changed mid-run.
    :param changed_dims: the length served once ``change_dims_after`` is reached.
    :param nan_texts_containing: the vector of a text containing this marker has NaN as its
        first component (JSON ``NaN`` with ``float``, the NaN bit pattern with ``base64``).
    :param duplicate_index: the last item of ``data`` repeats the first item's ``index``
        (the count stays right: one input has two vectors, another none).
    :param drop_last_item: ``data`` lacks its last item (one input without a vector).
    :param string_values: ``float`` answers carry each number as a JSON string (``"0.1"``).
    """

    def __init__(
        self,
        *,
        dims: int = 384,
        shuffle_index: bool = False,
        require_key: str | None = None,
        reject_texts_containing: str | None = None,
        accept_base64: bool = True,
        fail_texts_containing: str | None = None,
        fail_status: int = 503,
        reject_params: dict[str, str] | None = None,
        base64_refusal: int | None = None,
        omit_first_index: bool = False,
        key_header: str | None = None,
        max_inputs: int | None = None,
        change_dims_after: int | None = None,
        changed_dims: int = 255,
        nan_texts_containing: str | None = None,
        duplicate_index: bool = False,
        drop_last_item: bool = False,
        string_values: bool = False,
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        self.dims = dims
        self.shuffle_index = shuffle_index
        self.require_key = require_key
        self.reject_texts_containing = reject_texts_containing
        self.accept_base64 = accept_base64
        self.fail_texts_containing = fail_texts_containing
        self.fail_status = fail_status
        self.reject_params = dict(reject_params or {})
        self.base64_refusal = base64_refusal
        self.omit_first_index = omit_first_index
        self.key_header = key_header
        self.max_inputs = max_inputs
        self.change_dims_after = change_dims_after
        self.changed_dims = changed_dims
        self.nan_texts_containing = nan_texts_containing
        self.duplicate_index = duplicate_index
        self.drop_last_item = drop_last_item
        self.string_values = string_values
        self.answered = 0  # embedding requests answered with vectors (a 200)
        self._address = (host, port)
        self.lock = threading.Lock()
        self.requests = 0
        self.inputs = 0
        self.charged: collections.Counter[str] = collections.Counter()  # sha256(text) -> n
        self.log: list[dict[str, Any]] = []
        self._faults: collections.deque[Fault] = collections.deque()
        self._fail_when: Callable[[Any], Fault | None] | None = None
        self._httpd: _HTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle ---------------------------------------------------------------------

    def start(self) -> FakeEmbeddingServer:
        """Bind and serve in a daemon thread; returns self."""
        handler = type("Handler", (_Handler,), {"app": self})
        self._httpd = _HTTPServer(self._address, handler)
        self._thread = threading.Thread(
            target=self._httpd.serve_forever,
            kwargs={"poll_interval": 0.05},
            name="fake-openai",
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and close the listening socket (idempotent)."""
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None

    def __enter__(self) -> FakeEmbeddingServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:PORT/v1``; ``POST {base_url}/embeddings`` embeds."""
        assert self._httpd is not None, "server not started"
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}/v1"

    # -- test controls -----------------------------------------------------------------

    def script(self, faults: Iterable[Fault]) -> None:
        """Queue faults; each following request consumes one, in order."""
        with self.lock:
            self._faults.extend(dict(f) for f in faults)

    def fail_when(self, predicate: Callable[[Any], Fault | None] | None) -> None:
        """Set a hook called with each request's JSON; a returned fault is applied."""
        with self.lock:
            self._fail_when = predicate

    def heal(self) -> None:
        """Stop failing requests that hold ``fail_texts_containing``."""
        with self.lock:
            self.fail_texts_containing = None

    def reset(self) -> None:
        """Clear counters, log, queued faults and the ``fail_when`` hook."""
        with self.lock:
            self.requests = 0
            self.inputs = 0
            self.charged = collections.Counter()
            self.log = []
            self.answered = 0
            self._faults.clear()
            self._fail_when = None

    def charged_texts(self) -> collections.Counter[str]:
        """A copy of ``charged``: ``sha256(text)`` hex -> times the text was charged."""
        with self.lock:
            return collections.Counter(self.charged)

    def counters(self) -> dict[str, int]:
        """Return ``{"requests": ..., "inputs": ...}``."""
        with self.lock:
            return {"requests": self.requests, "inputs": self.inputs}

    # -- request handling --------------------------------------------------------------

    def _handle(self, handler: _Handler, raw: bytes) -> None:
        try:
            payload: Any = json.loads(raw)
        except ValueError:
            payload = None
        entry = self._start_entry(handler, payload)
        fault = self._take_fault(payload)
        if fault is not None and fault.get("delay_s"):
            time.sleep(float(fault["delay_s"]))
        if fault is not None and fault.get("reset") and not fault.get("after_work"):
            return self._reset(handler, entry)
        if fault is not None and "status" in fault:
            return self._reply_fault(handler, fault, entry)
        status, body, n_ok = self._answer(handler, payload)
        with self.lock:
            self.inputs += n_ok
            if n_ok:  # charged: counted per text (by hash), the independent truth of payment
                texts = (
                    payload["input"] if isinstance(payload["input"], list) else [payload["input"]]
                )
                self.charged.update(hashlib.sha256(t.encode()).hexdigest() for t in texts)
        if fault is not None and fault.get("reset"):
            return self._reset(handler, entry)
        entry["status"] = status
        self._reply(handler, status, body)

    def _start_entry(self, handler: _Handler, payload: Any) -> dict[str, Any]:
        body = payload if isinstance(payload, dict) else {}
        texts = body.get("input")
        entry = {
            "idempotency_key": handler.headers.get("Idempotency-Key"),
            "n_inputs": len(texts) if isinstance(texts, list) else int(texts is not None),
            "model": body.get("model"),
            "status": None,
            "encoding_format": body.get("encoding_format"),
            "dimensions": body.get("dimensions"),
            "authorization": handler.headers.get("Authorization") is not None,
            "at": time.monotonic(),
        }
        with self.lock:
            self.requests += 1
            self.log.append(entry)
        return entry

    def _take_fault(self, payload: Any) -> Fault | None:
        with self.lock:
            if self._faults:
                return self._faults.popleft()
            hook = self._fail_when
            marker, status = self.fail_texts_containing, self.fail_status
        fault = hook(payload) if hook is not None else None
        if (
            (fault is None or "status" not in fault)
            and marker is not None
            and isinstance(payload, dict)
        ):
            texts = payload.get("input")
            texts = texts if isinstance(texts, list) else [texts]
            if any(isinstance(t, str) and marker in t for t in texts):
                fault = {**(fault or {}), "status": status}  # a delay-only fault still fails
        return fault

    def _reset(self, handler: _Handler, entry: dict[str, Any]) -> None:
        entry["status"] = "reset"
        handler.close_connection = True
        handler.reset_on_finish = True

    def _reply_fault(self, handler: _Handler, fault: Fault, entry: dict[str, Any]) -> None:
        status = int(fault["status"])
        body = fault.get("body")
        if body is None:
            body = _error_body(f"scripted fault {status}", type_="server_error")
        if isinstance(body, str):
            body = body.encode()
        headers = dict(fault.get("headers") or {})
        if not any(k.lower() == "content-type" for k in headers):
            is_html = body.lstrip()[:1] == b"<"
            headers["Content-Type"] = "text/html; charset=utf-8" if is_html else "application/json"
        entry["status"] = status
        self._reply(handler, status, body, headers)

    def _reply(
        self, handler: _Handler, status: int, body: bytes, headers: dict[str, str] | None = None
    ) -> None:
        handler.send_response(status)
        headers = headers or {"Content-Type": "application/json"}
        for name, value in headers.items():
            handler.send_header(name, str(value))
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        handler.wfile.write(body)

    def _answer(self, handler: _Handler, payload: Any) -> tuple[int, bytes, int]:
        """Return (status, body, inputs embedded) for a request with no fault."""
        invalid = "invalid_request_error"
        if not handler.path.split("?")[0].rstrip("/").endswith("/embeddings"):
            return 404, _error_body("Unknown URL.", type_=invalid, code="unknown_url"), 0
        if self.require_key is not None:
            if self.key_header is not None:
                good = handler.headers.get(self.key_header) == self.require_key
            else:
                good = handler.headers.get("Authorization") == f"Bearer {self.require_key}"
            if not good:
                body = _error_body(
                    "Access denied due to invalid subscription key.", type_=invalid, code="401"
                )
                return 401, body, 0
        refusal = self._refuse_base64(payload)
        if refusal is not None:
            return refusal
        problem = self._invalid(payload)
        if problem is not None:
            return 400, problem, 0
        texts = payload["input"] if isinstance(payload["input"], list) else [payload["input"]]
        dims = int(payload.get("dimensions") or self.dims)
        fmt = payload.get("encoding_format") or "float"
        body = self._embeddings_body(texts, dims, fmt, payload["model"])
        return 200, body, len(texts)

    def _refuse_base64(self, payload: Any) -> tuple[int, bytes, int] | None:
        status = self.base64_refusal
        if status is None or not isinstance(payload, dict):
            return None
        if payload.get("encoding_format") != "base64":
            return None
        if status == 422:
            detail = [
                {
                    "loc": ["body", "encoding_format"],
                    "type": "literal_error",
                    "msg": "Input should be 'float'",
                    "input": "base64",
                }
            ]
            return 422, json.dumps({"detail": detail}).encode(), 0
        if status == 500:
            return 500, b"Internal Server Error", 0
        return (
            status,
            _error_body(
                "Invalid value for encoding_format: 'base64'.",
                type_="invalid_request_error",
                param="encoding_format",
            ),
            0,
        )

    def _invalid(self, payload: Any) -> bytes | None:
        """Return an OpenAI-shaped 400 body if the request is malformed, else None."""

        def bad(message: str, param: str | None) -> bytes:
            return _error_body(message, type_="invalid_request_error", param=param)

        if not isinstance(payload, dict) or not isinstance(payload.get("model"), str):
            return bad("We could not parse the JSON body of your request.", None)
        texts = payload.get("input")
        if isinstance(texts, str):
            texts = [texts]
        if not isinstance(texts, list) or not texts:
            return bad("'$.input' is invalid. Please check the API reference.", "input")
        if not all(isinstance(t, str) and t for t in texts):
            return bad("'$.input' is invalid. Please check the API reference.", "input")
        fmt = payload.get("encoding_format")
        if fmt not in (None, "float", "base64") or (fmt == "base64" and not self.accept_base64):
            return bad(f"Invalid value for encoding_format: {fmt!r}.", "encoding_format")
        for param, message in self.reject_params.items():
            if param in payload:
                return bad(message, param)
        if self.max_inputs is not None and len(texts) > self.max_inputs:
            return bad(f"too many inputs: {len(texts)} > {self.max_inputs} per request", "input")
        dims = payload.get("dimensions")
        if dims is not None and (type(dims) is not int or not 1 <= dims <= self.dims):
            return bad(f"dimensions must be between 1 and {self.dims}.", "dimensions")
        marker = self.reject_texts_containing
        if marker is not None and any(marker in t for t in texts):
            return bad("The input was rejected.", "input")
        return None

    def _embeddings_body(self, texts: list[str], dims: int, fmt: str, model: str) -> bytes:
        with self.lock:
            answered, self.answered = self.answered, self.answered + 1
        if self.change_dims_after is not None and answered >= self.change_dims_after:
            dims = self.changed_dims
        matrix = expected_matrix(texts, dims).astype("<f4", copy=True)
        marker = self.nan_texts_containing
        if marker is not None:
            matrix[[marker in t for t in texts], 0] = np.nan
        if fmt == "base64":
            vectors: list[Any] = [base64.b64encode(row.tobytes()).decode() for row in matrix]
        else:
            vectors = matrix.tolist()
            if self.string_values:
                vectors = [[repr(x) for x in row] for row in vectors]
        order = range(len(texts) - 1, -1, -1) if self.shuffle_index else range(len(texts))
        data = [{"object": "embedding", "index": i, "embedding": vectors[i]} for i in order]
        if self.omit_first_index:
            data[0].pop("index")
        if self.duplicate_index and len(data) > 1:
            data[-1]["index"] = data[0]["index"]
        if self.drop_last_item:
            data.pop()
        tokens = sum(max(1, len(t.split())) for t in texts)
        usage = {"prompt_tokens": tokens, "total_tokens": tokens}
        answer = {"object": "list", "data": data, "model": model, "usage": usage}
        return json.dumps(answer, separators=(",", ":")).encode()


def main(argv: Sequence[str] | None = None) -> int:
    """Serve until SIGTERM/SIGINT; print ``READY <base_url>`` first, a JSON counters line last."""
    parser = argparse.ArgumentParser(prog="python -m tests.support.fake_openai")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--dims", type=int, default=384)
    parser.add_argument("--shuffle-index", action="store_true")
    parser.add_argument("--reject-texts-containing", default=None)
    parser.add_argument(
        "--fail-texts-containing",
        default=None,
        help="answer --fail-status to requests holding this marker until POST /control/heal",
    )
    parser.add_argument("--fail-status", type=int, default=503)
    parser.add_argument(
        "--reject-param",
        action="append",
        default=[],
        metavar="PARAM=MESSAGE",
        help="answer 400 MESSAGE to requests carrying PARAM",
    )
    parser.add_argument("--base64-refusal", type=int, default=None, choices=(400, 422, 500))
    parser.add_argument("--omit-first-index", action="store_true")
    parser.add_argument("--max-inputs", type=int, default=None)
    parser.add_argument(
        "--delay-s",
        type=float,
        default=0.0,
        help="seconds every request waits before its answer (a slow server)",
    )
    args = parser.parse_args(argv)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    server = FakeEmbeddingServer(
        dims=args.dims,
        shuffle_index=args.shuffle_index,
        reject_texts_containing=args.reject_texts_containing,
        fail_texts_containing=args.fail_texts_containing,
        fail_status=args.fail_status,
        reject_params=dict(p.split("=", 1) for p in args.reject_param),
        base64_refusal=args.base64_refusal,
        omit_first_index=args.omit_first_index,
        max_inputs=args.max_inputs,
        host=args.host,
        port=args.port,
    ).start()
    if args.delay_s > 0:
        server.fail_when(lambda payload: {"delay_s": args.delay_s})
    print(f"READY {server.base_url}", flush=True)
    while not stop.wait(0.2):
        pass
    server.stop()
    print(json.dumps(server.counters()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
