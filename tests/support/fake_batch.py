"""A fake OpenAI Batch API beside the fake embeddings server: the same deterministic vectors.

Extends ``FakeEmbeddingServer`` (``tests/support/fake_openai.py``) with the documented Batch
API shapes (https://platform.openai.com/docs/api-reference/batch and
https://platform.openai.com/docs/api-reference/files):

- ``POST /v1/files`` (multipart, ``purpose=batch``) → a ``FileObject``;
  ``GET /v1/files/{id}/content`` → the file's bytes (input, output or error JSONL);
- ``POST /v1/batches`` ``{input_file_id, endpoint, completion_window, metadata}`` → a
  ``Batch`` in ``validating``; ``GET /v1/batches/{id}``; ``GET /v1/batches?limit&after``
  (newest first, ``has_more``); ``POST /v1/batches/{id}/cancel`` (→ ``cancelling``, then
  ``cancelled`` with what completed so far).

A batch is ``in_progress`` once polled, and ends ``complete_after_s`` seconds after its
create (default 0.1 s): every request line is answered like a synchronous
``POST /v1/embeddings`` (the parent's ``_answer``: its vectors are ``expected_matrix``),
written to the output file ``{id, custom_id, response: {status_code, request_id, body},
error: null}`` in reverse order (the order is not guaranteed); a request the parent answers
with an error goes to the error file with that status. Inputs are charged for answered
lines only (``batch_inputs``), and ``usage`` is ``max(1, words)`` tokens per input, as the
parent's.

Failure injection (attributes, set by tests before or between runs):

- ``expire_after``: a batch completes only its first N request lines, then ``expired``;
  the others are in the error file with code ``batch_expired`` (as OpenAI documents).
- ``create_fails_after_creating``: the next N creates make the batch, then answer 500.
- ``output_id_race``: the next N polls of a finished batch read ``completed`` with
  ``output_file_id`` and ``error_file_id`` still null.
- ``enqueued_token_limit``: a batch whose tokens (the parent's count) would bring the
  tokens of ``validating``/``in_progress``/``finalizing`` batches above it ends ``failed``
  with error code ``token_limit_exceeded`` (how OpenAI refuses it; nothing is charged).
- ``validation_error``: every new batch ends ``failed`` with this message (code
  ``invalid_request``), nothing charged.
- Always, as OpenAI does: an input file that repeats a ``custom_id`` fails validation
  whole (``failed``, code ``duplicate_custom_id``, naming the line), nothing charged.
- ``batch_texts_fail``: ``{marker: status}``: a line holding a text with that marker gets
  that status (e.g. 500) in the error file, ``batch_texts_fail_times`` times per request
  (its custom_id's last dot-separated field: the same request in another part; default: always).
- ``hold``: batches stay ``in_progress`` until set back to False (a run waiting).
- ``poll_status`` / ``list_status``: while set, ``GET /v1/batches/{id}`` (a poll) / ``GET
  /v1/batches`` (the list) answer this HTTP status (e.g. 503: the API went away); the
  list only once ``list_status_after`` batches exist.
- ``validation_error_after``: with ``validation_error``, the first N batches created pass
  validation (later ones fail): a run stopped while earlier batches still run.
- ``owner_scoped``: files and batches belong to the credential that created them (the
  ``Authorization`` or ``api-key`` header), as OpenAI's belong to an organization and
  project: another key gets 404 for their ids (``No batch found with id …``, ``No such
  File object: …``) and does not see them in the list.

``DELETE /v1/files/{id}`` deletes a file, as OpenAI's does (``{"id", "object": "file",
"deleted": true}``); its id is then a 404 (``No such File object``). ``reset_batches()``
clears the batches, counters and faults between tests.

Standalone (to try the CLI against it): ``python -m tests.support.fake_batch --port 8000
--complete-after-s 30`` prints ``READY http://127.0.0.1:8000/v1``, serves until SIGINT or
SIGTERM, then prints its counters as one JSON line.
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import json
import re
import signal
import sys
import threading
import time
from collections.abc import Sequence
from email.parser import BytesParser
from email.policy import HTTP
from typing import Any, ClassVar

from tests.support.fake_openai import FakeEmbeddingServer, _Handler, _HTTPServer

__all__ = ["FakeBatchServer"]

_ACTIVE = ("validating", "in_progress", "finalizing")


class _BatchHandler(_Handler):
    app: FakeBatchServer

    def do_POST(self) -> None:  # noqa: N802
        path = self.path.split("?")[0].rstrip("/")
        if "/files" in path or "/batches" in path:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length)
            status, body = self.app.batch_post(path, self.headers, raw)
            return self.app._reply(self, status, body)
        super().do_POST()

    def do_GET(self) -> None:  # noqa: N802
        path, _, query = self.path.partition("?")
        if "/files" in path or "/batches" in path:
            status, body = self.app.batch_get(path.rstrip("/"), query, self.headers)
            content = (
                "application/json"
                if path.endswith(("batches",)) or "/content" not in path
                else "application/octet-stream"
            )
            return self.app._reply(self, status, body, {"Content-Type": content})
        super().do_GET()

    def do_DELETE(self) -> None:  # noqa: N802
        status, body = self.app.batch_delete(self.path.split("?")[0].rstrip("/"), self.headers)
        return self.app._reply(self, status, body)


def _owner(headers: Any) -> str:
    """The credential a request carries (``owner_scoped``): who a file or batch belongs to."""
    return str(headers.get("Authorization") or headers.get("api-key") or "")


def _error(status: int, message: str, code: str | None = None) -> tuple[int, bytes]:
    return status, json.dumps(
        {
            "error": {
                "message": message,
                "type": "invalid_request_error",
                "param": None,
                "code": code,
            }
        }
    ).encode()


class FakeBatchServer(FakeEmbeddingServer):
    """``FakeEmbeddingServer`` plus the Batch and Files APIs (module docstring).

    Counters, under ``lock``: ``batch_inputs`` (inputs charged in batches), ``creates``
    (POST /v1/batches received), ``uploads``; ``batches`` and ``files`` by id;
    ``batch_charged`` (sha256 of each text charged in a batch → times), beside the parent's
    ``charged`` (the synchronous requests'): the independent truth of payment.
    ``requests``/``inputs`` stay the synchronous embeddings counters.
    """

    def __init__(self, *, complete_after_s: float = 0.1, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.complete_after_s = complete_after_s
        self.files: dict[str, dict[str, Any]] = {}
        self.contents: dict[str, bytes] = {}
        self.batches: dict[str, dict[str, Any]] = {}
        self._batch_tokens: dict[str, int] = {}
        self._seq = 0
        self.batch_inputs = 0
        self.batch_charged: collections.Counter[str] = collections.Counter()
        self.creates = 0
        self.uploads = 0
        self.expire_after: int | None = None
        self.create_fails_after_creating = 0
        self.output_id_race = 0
        self.enqueued_token_limit: int | None = None
        self.validation_error: str | None = None
        self.batch_texts_fail: dict[str, int] = {}
        self.batch_texts_fail_times: int | None = None
        self._failed_times: dict[str, int] = {}
        self.hold = False
        self.poll_status: int | None = None
        self.list_status: int | None = None
        self.list_status_after = 0  # list_status only once this many batches exist
        self.validation_error_after = 0
        self.owner_scoped = False
        self._owners: dict[str, str] = {}  # file or batch id -> the credential that made it
        self._finish_lock = threading.Lock()

    def reset_batches(self) -> None:
        """Forget every batch and the counters, and clear every fault (files may stay)."""
        self.reset()
        with self.lock:
            self.batch_inputs = self.creates = self.uploads = 0
            self.batch_charged = collections.Counter()
            self.batches.clear()
            self._owners.clear()
        self.expire_after = self.enqueued_token_limit = self.validation_error = None
        self.create_fails_after_creating = self.output_id_race = 0
        self.batch_texts_fail, self.batch_texts_fail_times, self.hold = {}, None, False
        self.reject_texts_containing = None
        self.poll_status = self.list_status = None
        self.list_status_after = 0
        self.validation_error_after, self.owner_scoped = 0, False

    def _visible(self, object_id: str, headers: Any) -> bool:
        """Whether the caller (its credential) may see ``object_id`` (``owner_scoped``)."""
        if not self.owner_scoped or headers is None:
            return True
        with self.lock:
            owner = self._owners.get(object_id)
        return owner is None or owner == _owner(headers)

    def start(self) -> FakeBatchServer:
        """Bind and serve in a daemon thread; returns self."""
        handler = type("Handler", (_BatchHandler,), {"app": self})
        self._httpd = _HTTPServer(self._address, handler)
        self._thread = threading.Thread(
            target=self._httpd.serve_forever,
            kwargs={"poll_interval": 0.05},
            name="fake-batch",
            daemon=True,
        )
        self._thread.start()
        return self

    def _new_id(self, prefix: str) -> str:
        with self.lock:
            self._seq += 1
            return f"{prefix}_{self._seq:06d}"

    # -- files -------------------------------------------------------------------------

    def _file(self, content: bytes, *, filename: str, purpose: str) -> dict[str, Any]:
        file_id = self._new_id("file")
        record = {
            "id": file_id,
            "object": "file",
            "bytes": len(content),
            "created_at": int(time.time()),
            "filename": filename,
            "purpose": purpose,
            "status": "processed",
            "expires_at": None,
            "status_details": None,
        }
        with self.lock:
            self.files[file_id] = record
            self.contents[file_id] = content
        return record

    def _upload(self, headers: Any, raw: bytes) -> tuple[int, bytes]:
        message = BytesParser(policy=HTTP).parsebytes(
            f"Content-Type: {headers.get('Content-Type')}\r\n\r\n".encode() + raw
        )
        fields: dict[str, tuple[str | None, bytes]] = {}
        for part in message.iter_parts():
            fields[str(part.get_param("name", header="content-disposition"))] = (
                part.get_filename(),
                part.get_payload(decode=True) or b"",
            )
        if fields.get("purpose", (None, b""))[1] != b"batch" or "file" not in fields:
            return _error(400, "purpose must be 'batch' and a file must be given")
        with self.lock:
            self.uploads += 1
        name, content = fields["file"]
        record = self._file(content, filename=name or "upload.jsonl", purpose="batch")
        with self.lock:
            self._owners[record["id"]] = _owner(headers)
        return 200, json.dumps(record).encode()

    # -- batches -----------------------------------------------------------------------

    def batch_post(self, path: str, headers: Any, raw: bytes) -> tuple[int, bytes]:
        """Route a POST under /v1/files or /v1/batches."""
        if path.endswith("/files"):
            return self._upload(headers, raw)
        cancel = re.search(r"/batches/([^/]+)/cancel$", path)
        if cancel:
            if not self._visible(cancel.group(1), headers):
                return _error(404, f"No batch found with id '{cancel.group(1)}'.")
            return self._cancel(cancel.group(1))
        if path.endswith("/batches"):
            return self._create(json.loads(raw or b"{}"), headers)
        return _error(404, "Unknown URL.", "unknown_url")

    def batch_delete(self, path: str, headers: Any) -> tuple[int, bytes]:
        """``DELETE /v1/files/{id}``: the file is gone (its id answers 404 from now on)."""
        match = re.search(r"/files/([^/]+)$", path)
        if match is None:
            return _error(404, "Unknown URL.", "unknown_url")
        file_id = match.group(1)
        with self.lock:
            known = file_id in self.files
        if not known or not self._visible(file_id, headers):
            return _error(404, f"No such File object: {file_id}")
        with self.lock:
            del self.files[file_id]
            del self.contents[file_id]
        return 200, json.dumps({"id": file_id, "object": "file", "deleted": True}).encode()

    def _create(self, body: dict[str, Any], headers: Any = None) -> tuple[int, bytes]:
        with self.lock:
            self.creates += 1
            fail_after = self.create_fails_after_creating > 0
            if fail_after:
                self.create_fails_after_creating -= 1
        file_id = body.get("input_file_id")
        if not self._visible(str(file_id), headers):
            return _error(400, f"Invalid 'input_file_id': '{file_id}'. File not found.")
        if (
            file_id not in self.contents
            or body.get("endpoint") != "/v1/embeddings"
            or body.get("completion_window") != "24h"
        ):
            return _error(400, "invalid input_file_id, endpoint or completion_window")
        metadata = body.get("metadata") or {}
        if len(metadata) > 16 or any(len(str(v)) > 512 for v in metadata.values()):
            return _error(400, "metadata: at most 16 keys, values of at most 512 characters")
        now = int(time.time())
        batch_id = self._new_id("batch")
        batch = {
            "id": batch_id,
            "object": "batch",
            "endpoint": "/v1/embeddings",
            "errors": None,
            "input_file_id": file_id,
            "completion_window": "24h",
            "status": "validating",
            "output_file_id": None,
            "error_file_id": None,
            "created_at": now,
            "in_progress_at": None,
            "expires_at": now + 86400,
            "finalizing_at": None,
            "completed_at": None,
            "failed_at": None,
            "expired_at": None,
            "cancelling_at": None,
            "cancelled_at": None,
            "request_counts": {"total": 0, "completed": 0, "failed": 0},
            "metadata": metadata,
            "model": None,
            "usage": None,
            "_created": time.monotonic(),
        }
        lines = [json.loads(line) for line in self.contents[file_id].splitlines() if line]
        duplicate = _first_duplicate(lines)
        tokens = sum(max(1, len(t.split())) for line in lines for t in _inputs(line))
        batch["request_counts"]["total"] = len(lines)
        batch["model"] = (lines[0].get("body") or {}).get("model") if lines else None
        with self.lock:
            limit = self.enqueued_token_limit
            enqueued = sum(
                self._batch_tokens.get(b["id"], 0)
                for b in self.batches.values()
                if b["status"] in _ACTIVE
            )
            valid = len(self.batches) < self.validation_error_after
            self.batches[batch_id] = batch
            self._batch_tokens[batch_id] = tokens
            self._owners[batch_id] = _owner(headers) if headers is not None else ""
            if duplicate is not None:
                self._fail(
                    batch,
                    "duplicate_custom_id",
                    "The custom_id for this request is a duplicate of another request. The "
                    "custom_id parameter must be unique for each individual request in a batch.",
                    line=duplicate,
                )
            elif limit is not None and enqueued + tokens > limit:
                self._fail(
                    batch,
                    "token_limit_exceeded",
                    f"Enqueued token limit reached for {lines[0]['body'].get('model')}"
                    f". Limit: {limit} enqueued tokens. Please try again once some "
                    "in_progress batches have been completed.",
                )
            elif self.validation_error is not None and not valid:
                self._fail(batch, "invalid_request", self.validation_error)
        if fail_after:
            return 500, b'{"error": {"message": "The server had an error", "type": "server_error"}}'
        return 200, json.dumps(_public(batch)).encode()

    def _fail(
        self, batch: dict[str, Any], code: str, message: str, *, line: int | None = None
    ) -> None:
        batch["status"] = "failed"
        batch["failed_at"] = int(time.time())
        batch["errors"] = {
            "object": "list",
            "data": [{"code": code, "message": message, "param": None, "line": line}],
        }

    def _cancel(self, batch_id: str) -> tuple[int, bytes]:
        with self.lock:
            batch = self.batches.get(batch_id)
            if batch is None:
                return _error(404, f"No batch found with id '{batch_id}'.")
            if batch["status"] in _ACTIVE:
                batch["status"] = "cancelling"
                batch["cancelling_at"] = int(time.time())
        return 200, json.dumps(_public(batch)).encode()

    def batch_get(self, path: str, query: str, headers: Any = None) -> tuple[int, bytes]:
        """Route a GET under /v1/files or /v1/batches (``headers``: the caller's, for
        ``owner_scoped``)."""
        content = re.search(r"/files/([^/]+)/content$", path)
        if content:
            with self.lock:
                data = self.contents.get(content.group(1))
            if data is None or not self._visible(content.group(1), headers):
                return _error(404, f"No such File object: {content.group(1)}")
            return 200, data
        one = re.search(r"/batches/([^/]+)$", path)
        if one and self.poll_status is not None:
            return _error(self.poll_status, "The server is unavailable.")
        if (
            path.endswith("/batches")
            and self.list_status is not None
            and len(self.batches) >= self.list_status_after
        ):
            return _error(self.list_status, "The server is unavailable.")
        if one:
            batch = self.batches.get(one.group(1))
            if batch is None or not self._visible(one.group(1), headers):
                return _error(404, f"No batch found with id '{one.group(1)}'.")
            self._advance(batch)
            return 200, json.dumps(self._as_polled(batch)).encode()
        if path.endswith("/batches"):
            return self._list(query, headers)
        return _error(404, "Unknown URL.", "unknown_url")

    def _list(self, query: str, headers: Any = None) -> tuple[int, bytes]:
        params = dict(p.split("=", 1) for p in query.split("&") if "=" in p)
        limit = int(params.get("limit", 20))
        with self.lock:
            ordered = sorted(self.batches.values(), key=lambda b: b["id"], reverse=True)
        ordered = [b for b in ordered if self._visible(b["id"], headers)]
        after = params.get("after")
        if after:
            ordered = [b for b in ordered if b["id"] < after]
        page = ordered[:limit]
        data = [_public(b) for b in page]
        return 200, json.dumps(
            {
                "object": "list",
                "data": data,
                "first_id": data[0]["id"] if data else None,
                "last_id": data[-1]["id"] if data else None,
                "has_more": len(ordered) > limit,
            }
        ).encode()

    def _as_polled(self, batch: dict[str, Any]) -> dict[str, Any]:
        public = _public(batch)
        if batch["status"] == "completed":
            with self.lock:
                race = self.output_id_race > 0
                if race:
                    self.output_id_race -= 1
            if race:
                public["output_file_id"] = public["error_file_id"] = None
        return public

    def _advance(self, batch: dict[str, Any]) -> None:
        with self._finish_lock:
            status = batch["status"]
            if status == "validating":
                batch["status"] = "in_progress"
                batch["in_progress_at"] = int(time.time())
                return
            due = time.monotonic() - batch["_created"] >= self.complete_after_s
            if status == "cancelling" or (status == "in_progress" and due and not self.hold):
                self._finish(batch, cancelled=status == "cancelling")

    def _finish(self, batch: dict[str, Any], *, cancelled: bool) -> None:
        lines = [
            json.loads(line) for line in self.contents[batch["input_file_id"]].splitlines() if line
        ]
        done_n = len(lines) if self.expire_after is None or cancelled else self.expire_after
        if cancelled:
            done_n = len(lines) // 2  # what had completed when the cancel arrived
        outputs, errors, charged = [], [], 0
        charged_texts: list[str] = []
        for number, line in enumerate(lines):
            custom_id = line["custom_id"]
            if number >= done_n:
                code = "batch_cancelled" if cancelled else "batch_expired"
                errors.append(
                    {
                        "id": f"batch_req_{self._new_id('r')}",
                        "custom_id": custom_id,
                        "response": None,
                        "error": {
                            "code": code,
                            "message": "This request could not be executed before the completion "
                            "window expired."
                            if not cancelled
                            else "cancelled",
                        },
                    }
                )
                continue
            status, body, inputs = self._line_answer(line)
            record = {
                "id": f"batch_req_{self._new_id('r')}",
                "custom_id": custom_id,
                "response": {
                    "status_code": status,
                    "request_id": self._new_id("req"),
                    "body": json.loads(body),
                },
                "error": None,
            }
            if status == 200:
                charged += inputs
                charged_texts.extend(_inputs(line))
                outputs.append(record)
            else:
                errors.append(record)
        outputs.reverse()  # the order is not guaranteed: never the input's
        now = int(time.time())
        with self.lock:
            self.batch_inputs += charged
            self.batch_charged.update(hashlib.sha256(t.encode()).hexdigest() for t in charged_texts)
        if outputs:
            out = self._file(_jsonl(outputs), filename="batch_output.jsonl", purpose="batch_output")
            batch["output_file_id"] = out["id"]
        if errors:
            err = self._file(_jsonl(errors), filename="batch_errors.jsonl", purpose="batch_output")
            batch["error_file_id"] = err["id"]
        with self.lock:  # a batch's result files belong to whoever owns the batch
            for file_id in (batch["output_file_id"], batch["error_file_id"]):
                if file_id and batch["id"] in self._owners:
                    self._owners[file_id] = self._owners[batch["id"]]
        batch["request_counts"] = {
            "total": len(lines),
            "completed": len(outputs),
            "failed": len(errors),
        }
        batch["finalizing_at"] = now
        tokens = sum(
            int(((r["response"] or {}).get("body") or {}).get("usage", {}).get("total_tokens", 0))
            for r in outputs
        )
        batch["usage"] = {
            "input_tokens": tokens,
            "output_tokens": 0,
            "total_tokens": tokens,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens_details": {"reasoning_tokens": 0},
        }
        if cancelled:
            batch["status"], batch["cancelled_at"] = "cancelled", now
        elif self.expire_after is not None and done_n < len(lines):
            batch["status"], batch["expired_at"] = "expired", now
        else:
            batch["status"], batch["completed_at"] = "completed", now

    def _line_answer(self, line: dict[str, Any]) -> tuple[int, bytes, int]:
        texts = _inputs(line)
        for marker, status in self.batch_texts_fail.items():
            if any(marker in t for t in texts):
                # the request, whichever batch carries it (embedline's custom_id is
                # "CHUNK.PART.KEY": a resubmission is another part, the same KEY)
                request = str(line["custom_id"]).rsplit(".", 1)[-1]
                with self.lock:
                    times = self._failed_times.get(request, 0)
                    limit = self.batch_texts_fail_times
                    if limit is None or times < limit:
                        self._failed_times[request] = times + 1
                        return (
                            status,
                            json.dumps(
                                {
                                    "error": {
                                        "message": (
                                            "The server had an error processing your request."
                                        ),
                                        "type": "server_error",
                                        "param": None,
                                        "code": None,
                                    }
                                }
                            ).encode(),
                            0,
                        )

        class _Path:  # the parent's _answer reads only handler.path and headers
            path = "/v1/embeddings"
            headers: ClassVar[dict[str, str]] = {}

        return self._answer(_Path(), line.get("body"))  # type: ignore[arg-type]

    def batch_counters(self) -> dict[str, int]:
        """``{"batch_inputs", "creates", "uploads", "batches", "requests"}`` (requests: the
        synchronous embeddings requests)."""
        with self.lock:
            return {
                "batch_inputs": self.batch_inputs,
                "creates": self.creates,
                "uploads": self.uploads,
                "batches": len(self.batches),
                "requests": self.requests,
            }


def _first_duplicate(lines: list[dict[str, Any]]) -> int | None:
    """The 1-based number of the first line whose ``custom_id`` an earlier line has."""
    seen: set[object] = set()
    for number, line in enumerate(lines, start=1):
        if line.get("custom_id") in seen:
            return number
        seen.add(line.get("custom_id"))
    return None


def _inputs(line: dict[str, Any]) -> list[str]:
    value = (line.get("body") or {}).get("input")
    return value if isinstance(value, list) else [value] if isinstance(value, str) else []


def _public(batch: dict[str, Any]) -> dict[str, Any]:
    return {
        k: (dict(v) if isinstance(v, dict) else v)
        for k, v in batch.items()
        if not k.startswith("_")
    }


def _jsonl(records: list[dict[str, Any]]) -> bytes:
    return b"".join(json.dumps(r, separators=(",", ":")).encode() + b"\n" for r in records)


def main(argv: Sequence[str] | None = None) -> int:
    """Serve until SIGTERM/SIGINT; print ``READY <base_url>`` first, the batch counters (a
    JSON line) last."""
    parser = argparse.ArgumentParser(prog="python -m tests.support.fake_batch")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--dims", type=int, default=384)
    parser.add_argument(
        "--complete-after-s",
        type=float,
        default=0.1,
        help="seconds from a batch's create to its end",
    )
    parser.add_argument(
        "--expire-after",
        type=int,
        default=None,
        help="a batch runs only its first N requests, then expires",
    )
    args = parser.parse_args(argv)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    server = FakeBatchServer(
        dims=args.dims, complete_after_s=args.complete_after_s, host=args.host, port=args.port
    ).start()
    server.expire_after = args.expire_after
    print(f"READY {server.base_url}", flush=True)
    while not stop.wait(0.2):
        pass
    server.stop()
    print(json.dumps(server.batch_counters()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
