"""The client for OpenAI's Batch API with ``endpoint=/v1/embeddings``, over httpx.

Files (``POST /files`` with ``purpose=batch``, ``GET /files/{id}/content``) and batches
(``POST /batches``, ``GET /batches/{id}``, ``GET /batches?limit&after``,
``POST /batches/{id}/cancel``). Every call but ``create_batch`` is retried under
``embedline.retry`` (an upload sent twice only leaves an unused file); a batch's create has
no idempotency key, so it is sent once: the caller adopts, by listing, a batch that a failed
or timed-out create may have made (``tasks/batch/calls.py``). Answers are classified like the
synchronous client's (``classify``), and so is an endpoint that refuses every connection
(``FatalLatch.unreachable``: exit 3 before any answer, exit 1 after one). A 404 for a batch
or file id is ``UnknownBatchError`` (another key or account, or gone), for the collection
paths a server without a Batch API. Nothing here logs or raises with input text, vectors
or the API key.

Rule sources: https://platform.openai.com/docs/api-reference/batch (create, retrieve,
list, cancel; statuses ``validating, failed, in_progress, finalizing, completed, expired,
cancelling, cancelled``; ``request_counts``), https://platform.openai.com/docs/guides/batch
(input lines ``{custom_id, method, url, body}``; output and error lines ``{id, custom_id,
response: {status_code, body}, error}``; limits 50,000 requests, 200 MB and, for
embeddings, 50,000 inputs per batch; ``token_limit_exceeded``).
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import httpx

from adapters.embeddings.classify import classify, classify_transport_error
from adapters.embeddings.common import HTTP_LOGGER, Logger
from adapters.embeddings.decode import json_or_none
from adapters.embeddings.endpoint import auth_headers, auth_hint, check_api_key, safe_url
from adapters.embeddings.latch import FatalLatch
from embedline.errors import (
    BadResponseError,
    EmbedlineError,
    FatalError,
    RowError,
    UnknownBatchError,
)
from embedline.retry import request_retrying

__all__ = [
    "BATCH_ENDPOINT",
    "TERMINAL_STATUSES",
    "BatchClient",
    "TokenLimitError",
    "parse_result_lines",
]

BATCH_ENDPOINT = "/v1/embeddings"
#: A batch in one of these statuses changes no more (OpenAI Batch API reference).
TERMINAL_STATUSES = frozenset({"completed", "failed", "expired", "cancelled"})
_ONE_BATCH = re.compile(r"^/batches/([^/]+)(?:/cancel)?$")
_ONE_FILE = re.compile(r"^/files/([^/]+)(?:/content)?$")


class BatchClient:
    """Files and batches of one account at ``base_url`` (e.g. ``https://api.openai.com/v1``).

    :param api_key: sent as the synchronous client sends it (``auth_header``).
    :param timeout_s: per-request timeout, seconds (an upload of 200 MB needs more).
    :param max_attempts: attempts of every retried call, the first included.
    :param client: an ``httpx.Client`` to use (tests); not closed by ``close()``.
    :param sleep: backoff sleeps (tests record them).
    """

    def __init__(
        self,
        *,
        base_url: str,
        api_key: str | None,
        timeout_s: float = 120.0,
        max_attempts: int = 6,
        auth_header: str = "Authorization",
        client: httpx.Client | None = None,
        logger: Logger | None = None,
        sleep: Callable[[float], None] | None = None,
    ) -> None:
        check_api_key(api_key)
        self.base_url = base_url.rstrip("/")
        self.max_attempts = max_attempts
        self._headers = auth_headers(api_key, auth_header)
        self._hint = auth_hint(api_key, auth_header)
        self._owns_client = client is None
        self._client = (
            client if client is not None else httpx.Client(timeout=httpx.Timeout(timeout_s))
        )
        self._logger: Logger = logger or logging.getLogger(HTTP_LOGGER)
        self._sleep = sleep
        self._latch = FatalLatch(self._logger)  # the circuit breaker of a dead endpoint

    def __repr__(self) -> str:
        return f"BatchClient(base_url={safe_url(self.base_url)!r})"

    def close(self) -> None:
        """Close the HTTP connections, unless the ``httpx.Client`` was injected."""
        if self._owns_client:
            self._client.close()

    # -- files -----------------------------------------------------------------------

    def upload(self, name: str, content: bytes) -> str:
        """Upload a JSONL batch input file (``purpose=batch``); return its file id.

        :raises RetryableError: still failing after ``max_attempts``.
        :raises FatalError: credentials, quota, or a refusal of the file.
        """
        answer = self._call(
            "POST",
            "/files",
            files={"file": (name, content, "application/jsonl")},
            data={"purpose": "batch"},
        )
        return str(_field(answer, "id"))

    def file_content(self, file_id: str) -> bytes:
        """The bytes of a file (a batch's input, output or error JSONL).

        :raises UnknownBatchError: no such file for this key (deleted, another account).
        """
        return self._call("GET", f"/files/{file_id}/content", raw=True)  # type: ignore[no-any-return]  # bytes

    # -- batches ---------------------------------------------------------------------

    def create_batch(self, input_file_id: str, metadata: Mapping[str, str]) -> dict[str, Any]:
        """Create a batch of ``input_file_id`` for ``/v1/embeddings`` in the 24 h window,
        sent once (no idempotency key exists: never retried here); return the batch.

        :raises RetryableError: the create failed or timed out: a batch may exist anyway;
            the caller lists the account's batches and adopts it.
        :raises TokenLimitError: ``token_limit_exceeded`` (the enqueued-token budget).
        :raises FatalError: any other refusal.
        """
        body = {
            "input_file_id": input_file_id,
            "endpoint": BATCH_ENDPOINT,
            "completion_window": "24h",
            "metadata": dict(metadata),
        }
        try:
            return self._call("POST", "/batches", json=body, attempts=1)  # type: ignore[no-any-return]  # JSON
        except (RowError, FatalError) as exc:
            if "token_limit_exceeded" in str(exc):
                raise TokenLimitError(str(exc)) from None
            if isinstance(exc, RowError):
                raise FatalError(f"the batch was refused: {exc}") from None
            raise

    def get_batch(self, batch_id: str) -> dict[str, Any]:
        """The batch ``batch_id`` as the API shows it now.

        :raises UnknownBatchError: no such batch for this key (another account, purged).
        """
        return self._call("GET", f"/batches/{batch_id}")  # type: ignore[no-any-return]  # JSON

    def cancel_batch(self, batch_id: str) -> dict[str, Any]:
        """Ask to cancel ``batch_id`` (it goes ``cancelling``, then ``cancelled``).

        :raises UnknownBatchError: no such batch for this key (another account, purged).
        """
        return self._call("POST", f"/batches/{batch_id}/cancel")  # type: ignore[no-any-return]  # JSON

    def list_batches(self, *, page_size: int = 100) -> Iterator[dict[str, Any]]:
        """Every batch of the account, newest first (``limit``/``after`` pages).

        :raises FatalError: the answer is no batch list (a server without a Batch API).
        """
        after: str | None = None
        while True:
            params: dict[str, Any] = {"limit": page_size}
            if after:
                params["after"] = after
            page = self._call("GET", "/batches", params=params)
            data = page.get("data") if isinstance(page, dict) else None
            if not isinstance(data, list):  # e.g. a health check answering every GET
                raise FatalError(
                    f"{safe_url(self.base_url)} has no Batch API (GET /batches: no batch "
                    "list): run without --batch-api, or point --base-url at a server that "
                    "offers one"
                )
            yield from data
            if not page.get("has_more") or not data:
                return
            after = str(data[-1]["id"])

    # -- one call --------------------------------------------------------------------

    def _call(
        self,
        method: str,
        path: str,
        *,
        attempts: int | None = None,
        raw: bool = False,
        **kwargs: Any,
    ) -> Any:
        """One call, retried ``attempts`` times (default ``max_attempts``). A call that used
        them all on refused connections opens the circuit breaker, as the synchronous
        client's does: ``FatalError`` if the endpoint never answered this client (a wrong
        ``--base-url``, a server not running: exit 3), else ``EndpointDownError`` (exit 1);
        every later call raises it again unsent. Not for a call of one attempt (a create:
        one refused connection is no outage)."""
        self._latch.check()
        tries = attempts or self.max_attempts
        retrying = (
            request_retrying(max_attempts=tries, sleep=self._sleep)
            if self._sleep
            else request_retrying(max_attempts=tries)
        )
        try:
            for attempt in retrying:
                with attempt:
                    return self._once(method, path, raw=raw, **kwargs)
        except EmbedlineError as exc:
            down = (
                None
                if attempts is not None
                else self._latch.unreachable(
                    exc, where=safe_url(self.base_url), max_attempts=self.max_attempts
                )
            )
            if down is None:
                raise
            self._latch.stop(down)
            raise down from None
        raise AssertionError("unreachable")  # pragma: no cover

    def _once(self, method: str, path: str, *, raw: bool, **kwargs: Any) -> Any:
        url = self.base_url + path
        try:
            response = self._client.request(method, url, headers=self._headers, **kwargs)
        except httpx.RequestError as exc:  # the cause kept: the circuit breaker reads it
            raise classify_transport_error(exc, where=safe_url(self.base_url)) from exc
        self._latch.note_answer()
        self._logger.info('HTTP Request: %s %s "%d"', method, safe_url(url), response.status_code)
        if raw and 200 <= response.status_code < 300:
            return response.content
        if response.status_code == 404:
            raise self._not_found(method, path)
        payload = json_or_none(response)
        error = classify(
            response.status_code,
            response.headers,
            payload,
            model="batch",
            path=path,
            auth_hint=self._hint,
        )
        if error is not None:
            raise error
        return payload

    def _not_found(self, method: str, path: str) -> FatalError:
        """The error of a 404: for one batch or file (an id embedline recorded),
        ``UnknownBatchError`` naming it; for the collections (``/files``, ``/batches``), a
        server that has no Batch API."""
        where = safe_url(self.base_url)
        batch, file = _ONE_BATCH.match(path), _ONE_FILE.match(path)
        if batch is not None:
            return UnknownBatchError(where=where, batch_id=batch.group(1))
        if file is not None:
            return UnknownBatchError(where=where, file_id=file.group(1))
        return FatalError(
            f"{where} has no Batch API ({method} {path}: HTTP 404): run without "
            "--batch-api, or point --base-url at a server that offers one",
            http_status=404,
        )


class TokenLimitError(EmbedlineError):
    """Raised when the provider refuses a batch: the enqueued-token budget of the model is
    full (``token_limit_exceeded``); earlier batches must finish first."""


def _field(payload: object, name: str) -> object:
    if not isinstance(payload, dict) or name not in payload:
        raise BadResponseError(f"the answer has no {name!r}")
    return payload[name]


def parse_result_lines(content: bytes) -> Iterator[dict[str, Any]]:
    """The JSON objects of a batch output or error file, one per non-empty line.

    :raises BadResponseError: a line is not a JSON object with a ``custom_id``.
    """
    for line in content.splitlines():
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            raise BadResponseError("a batch result line is not JSON") from None
        if not isinstance(record, dict) or not isinstance(record.get("custom_id"), str):
            raise BadResponseError("a batch result line has no custom_id")
        yield record
