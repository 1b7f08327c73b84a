"""Batch API mode, pure parts: a chunk's requests, its input lines, parts, and results.

The flow process (``flows/batch_stage.py``) calls ``chunk_requests`` for what a chunk sends: the
rows the chunk task would send synchronously (not reused, not a duplicate within the chunk,
not empty, not too long), in the same request batches. Each request's ``custom_id`` is its
``Idempotency-Key`` (``keys.request_key`` of its row keys): stable across retries, reruns
and crashes, and the only way results are matched (the output file's order is not
guaranteed). What a batch carried is recorded as its ``layout`` (custom_ids and row
positions, ``embedline.models.BatchLayout``) when it is submitted; ``layout_requests``
rebuilds those requests from the rows, so a rerun with other batching settings
(``--batch-size``, ``--batch-max-inputs``, ``--max-request-tokens``) still matches the
answers of the batches already submitted.

One batch carries the parts of many chunks (``pack_parts``): in its input file each
request's ``custom_id`` is ``wire_id(chunk, part, custom_id)``, so custom_ids are unique
within a batch by construction (a request key is unique within a chunk's part) and every
line names the chunk and part it belongs to; ``split_input`` takes each chunk's lines back
(plain custom_ids), ``BatchResults.add_output(..., chunk=)`` one chunk's answers. A line
without that prefix (a batch of one chunk made before parts were packed) is the chunk's
whose batch it is. No I/O here.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from adapters.embeddings import estimate_tokens
from adapters.embeddings.decode import parse_embeddings
from adapters.embeddings.openai_batch import BATCH_ENDPOINT, parse_result_lines
from embedline.keys import request_key, row_key
from embedline.models import BatchLayout, ReusePlan, Row
from embedline.settings import RunSettings
from tasks.embed.rows import batches
from tasks.reuse.chunk_side import split_duplicates, take_prefill

__all__ = [
    "BATCH_MAX_BYTES",
    "BatchRequest",
    "BatchResults",
    "Resolved",
    "chunk_requests",
    "fit",
    "input_file",
    "layout_from_input",
    "layout_of",
    "layout_requests",
    "pack",
    "pack_parts",
    "sent_text_sha256",
    "split_input",
    "split_wire_id",
    "unique",
    "wire_id",
]

#: A batch input file's limit is 200 MB (OpenAI Batch guide); kept 5 % below it.
BATCH_MAX_BYTES = 190_000_000
#: Error codes of per-request failures that say nothing about the input: sent again.
_NOT_RUN_CODES = frozenset({"batch_expired", "batch_cancelled"})
#: Bytes a line's ``wire_id`` adds at most to its custom_id (``"99999999.9999."``).
_WIRE_BYTES = 16


def wire_id(chunk: int, part: int, custom_id: str) -> str:
    """The ``custom_id`` a request of chunk ``chunk``'s part ``part`` carries in a batch
    input file: ``"{chunk}.{part}.{custom_id}"`` (a request key is hex: no dot in it)."""
    return f"{chunk}.{part}.{custom_id}"


def split_wire_id(wire: str) -> tuple[int, int, str] | None:
    """``(chunk, part, custom_id)`` of a ``wire_id``; None for a plain custom_id (a batch
    made before parts were packed: one chunk's)."""
    chunk, dot, rest = wire.partition(".")
    part, dot2, custom_id = rest.partition(".")
    if not (dot and dot2 and chunk.isdigit() and part.isdigit() and custom_id):
        return None
    return int(chunk), int(part), custom_id


def split_input(content: bytes) -> dict[int | None, dict[int | None, bytes]]:
    """A batch input file ``content``'s lines by chunk and part, with plain custom_ids;
    lines without a ``wire_id`` (a batch of one chunk, made before parts were packed) under
    ``None`` (chunk and part), as they are."""
    found: dict[int | None, dict[int | None, list[bytes]]] = {}
    for line in content.splitlines():
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            continue
        custom_id = record.get("custom_id") if isinstance(record, dict) else None
        if not isinstance(custom_id, str):
            continue
        split = split_wire_id(custom_id)
        if split is None:
            found.setdefault(None, {}).setdefault(None, []).append(line + b"\n")
        else:
            record["custom_id"] = split[2]
            lines = found.setdefault(split[0], {}).setdefault(split[1], [])
            lines.append(json.dumps(record, ensure_ascii=False).encode() + b"\n")
    return {
        chunk: {part: b"".join(lines) for part, lines in parts.items()}
        for chunk, parts in found.items()
    }


def sent_text_sha256(text: str) -> str:
    """The hex SHA-256 of a text as sent (``keys.text_sha256``: texts are cut when read)."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


@dataclass(frozen=True, slots=True)
class BatchRequest:
    """One request of a chunk: its ``custom_id`` and ``texts`` as sent (never logged)."""

    custom_id: str
    texts: tuple[str, ...] = field(repr=False)
    row_keys: tuple[str, ...] = ()
    rows: tuple[int, ...] = ()  # 0-based positions of its rows within the chunk's rows

    def singles(self) -> list[BatchRequest]:
        """The request's inputs as one request each (a rejected request of several inputs
        is sent again this way, so the rejected input is found: a dead letter)."""
        return [
            BatchRequest(request_key([k]), (t,), (k,), (p,))
            for t, k, p in zip(self.texts, self.row_keys, self.rows, strict=True)
        ]

    @property
    def estimated_tokens(self) -> int:
        """``estimate_tokens`` summed over the texts (for the enqueued-token budget)."""
        return sum(estimate_tokens(t) for t in self.texts)


def chunk_requests(
    rows: Sequence[Row],
    plan: ReusePlan,
    settings: RunSettings,
    *,
    only: Collection[int] | None = None,
) -> list[BatchRequest]:
    """The requests a chunk of ``rows`` sends, given its reuse ``plan``: rows the plan does
    not list (in-run owners, copied vectors), without in-chunk duplicates, empty texts and
    (``on_too_long=dead-letter``) texts over ``max_input_tokens`` by the lenient estimate
    (``truncate``: texts were cut when read); batched by ``batch_size`` and ``max_request_tokens``.
    ``only``: of those, the rows at these positions (0-based in ``rows``) alone."""
    planned = {p for source in plan.sources for p in source.rows}
    position = {id(r): i for i, r in enumerate(rows)}
    copied = take_prefill(rows, plan).vectors  # by row number, as the chunk task takes them
    send, _ = split_duplicates(
        [r for i, r in enumerate(rows) if i not in planned and r.row_number not in copied]
    )
    limit = settings.max_input_tokens
    kept = [
        row
        for row in send
        if row.text.strip()
        and not (
            limit is not None
            and settings.on_too_long != "truncate"
            and math.ceil(len(row.text) / 4) > limit
        )
    ]
    if only is not None:
        kept = [row for row in kept if position[id(row)] in only]
    model, dims = settings.effective_model, settings.dimensions
    requests = []
    for batch in batches(
        kept, batch_size=settings.batch_size, max_request_tokens=settings.max_request_tokens
    ):
        keys = [row_key(r.id, r.text_sha256, model, dims) for r in batch]
        requests.append(
            BatchRequest(
                request_key(keys),
                tuple(r.text for r in batch),
                tuple(keys),
                tuple(position[id(r)] for r in batch),
            )
        )
    return requests


def layout_of(requests: Iterable[BatchRequest]) -> BatchLayout:
    """What the ledger records of a batch's ``requests``: ``(custom_id, row positions)``."""
    return tuple((r.custom_id, r.rows) for r in requests)


def layout_requests(
    rows: Sequence[Row], layout: BatchLayout, settings: RunSettings
) -> list[BatchRequest]:
    """The requests a recorded ``layout`` describes, rebuilt from the chunk's ``rows``
    (texts as sent), whatever the batching settings are now. A request whose rows' keys do
    not make its ``custom_id`` (not the rows it was built from, or another model or
    dimensions) is left out: its answers are never matched to these rows."""
    model, dims = settings.effective_model, settings.dimensions
    requests = []
    for custom_id, positions in layout:
        if not positions or not all(0 <= p < len(rows) for p in positions):
            continue
        picked = [rows[p] for p in positions]
        keys = tuple(row_key(r.id, r.text_sha256, model, dims) for r in picked)
        if request_key(keys) == custom_id:
            requests.append(
                BatchRequest(
                    custom_id,
                    tuple(r.text for r in picked),
                    keys,
                    tuple(positions),
                )
            )
    return requests


def layout_from_input(rows: Sequence[Row], content: bytes, settings: RunSettings) -> BatchLayout:
    """The layout of a batch input file ``content`` over the chunk's ``rows``: for each
    line, its ``custom_id`` and the positions of rows whose texts it sends, kept only when
    the rows' keys make that ``custom_id`` (``request_key``), so a batch found at the
    provider is matched to exactly the requests it answers, whatever settings built it.
    A line no rows of the chunk make is left out (its answer is never used); a line's
    ``wire_id`` is read as its custom_id."""
    model, dims = settings.effective_model, settings.dimensions
    by_text: dict[str, list[int]] = {}
    for position, row in enumerate(rows):
        by_text.setdefault(row.text_sha256, []).append(position)  # of the text as sent
    layout = []
    for line in content.splitlines():
        try:
            record = json.loads(line) if line.strip() else None
        except ValueError:
            record = None
        body = record.get("body") if isinstance(record, dict) else None
        texts = body.get("input") if isinstance(body, dict) else None
        custom_id = record.get("custom_id") if isinstance(record, dict) else None
        if not isinstance(custom_id, str) or not isinstance(texts, list) or not texts:
            continue
        split = split_wire_id(custom_id)
        custom_id = custom_id if split is None else split[2]
        options = [by_text.get(sent_text_sha256(str(t)), []) for t in texts]
        # the same text on several rows (ids differ): the row whose keys make the custom_id
        for picked in itertools.islice(itertools.product(*options), 256):
            keys = [row_key(rows[p].id, rows[p].text_sha256, model, dims) for p in picked]
            if request_key(keys) == custom_id:
                layout.append((custom_id, tuple(picked)))
                break
    return tuple(layout)


def _line(request: BatchRequest, settings: RunSettings, wire: str | None = None) -> bytes:
    body: dict[str, object] = {
        "model": settings.effective_model,
        "input": list(request.texts),
        "encoding_format": "float" if settings.encoding_format == "float" else "base64",
    }
    if settings.dimensions is not None:
        body["dimensions"] = settings.dimensions
    line = {
        "custom_id": wire or request.custom_id,
        "method": "POST",
        "url": BATCH_ENDPOINT,
        "body": body,
    }
    return json.dumps(line, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"


def input_file(
    parts: Iterable[tuple[int, int, Iterable[BatchRequest]]], settings: RunSettings
) -> bytes:
    """The JSONL batch input file of ``parts`` ``(chunk, part, requests)``: one
    ``{custom_id, method, url, body}`` line per request, its custom_id a ``wire_id``;
    base64 vectors unless ``--encoding-format float``.

    Every custom_id is unique within the file by construction (the provider fails a batch
    that repeats one whole, ``duplicate_custom_id``): a request's custom_id is the
    ``request_key`` of its rows, so the same custom_id in the same part is the same
    request, written once."""
    seen: set[str] = set()
    lines = []
    for chunk, part, requests in parts:
        for request in requests:
            wire = wire_id(chunk, part, request.custom_id)
            if wire not in seen:
                seen.add(wire)
                lines.append(_line(request, settings, wire))
    return b"".join(lines)


def unique(requests: Iterable[BatchRequest]) -> list[BatchRequest]:
    """``requests`` with each custom_id once, in order (what one part may carry)."""
    seen: set[str] = set()
    kept = []
    for request in requests:
        if request.custom_id not in seen:
            seen.add(request.custom_id)
            kept.append(request)
    return kept


def fit(requests: Iterable[BatchRequest], max_tokens: int | None) -> list[BatchRequest]:
    """``requests`` with each one of several inputs whose estimated tokens exceed
    ``max_tokens`` (the enqueued-token budget) replaced by its inputs one per request
    (``BatchRequest.singles``), so that every part ``pack`` makes of them can fit; each
    custom_id once. A single input over the budget stays as it is (nothing to split)."""
    fitted: list[BatchRequest] = []
    for request in requests:
        over = max_tokens is not None and request.estimated_tokens > max_tokens
        fitted += request.singles() if over and len(request.texts) > 1 else [request]
    return unique(fitted)


def pack(
    requests: Sequence[BatchRequest], settings: RunSettings, *, max_tokens: int | None = None
) -> list[tuple[int, int]]:
    """Split ``requests`` into consecutive parts ``[start, stop)``: each at most
    ``batch_max_inputs`` inputs (≤ 50,000, OpenAI's limit for embeddings), 50,000 requests,
    ``BATCH_MAX_BYTES`` bytes and, when given, ``max_tokens`` estimated tokens (the
    enqueued-token budget, ``--batch-enqueued-tokens``). A single larger request goes alone."""
    return pack_parts([[r] for r in requests], settings, max_tokens=max_tokens)


def pack_parts(
    parts: Sequence[Sequence[BatchRequest]],
    settings: RunSettings,
    *,
    max_tokens: int | None = None,
) -> list[tuple[int, int]]:
    """Group consecutive ``parts`` (each the requests of one chunk's part, never split)
    into batches ``[start, stop)`` of parts within the limits ``pack`` names, each line
    counted with its ``wire_id``. A single part over a limit goes alone."""
    groups: list[tuple[int, int]] = []
    start, inputs, count, size, tokens = 0, 0, 0, 0, 0
    for i, requests in enumerate(parts):
        n = sum(len(r.texts) for r in requests)
        b = sum(len(_line(r, settings)) + _WIRE_BYTES for r in requests)
        t = sum(r.estimated_tokens for r in requests)
        full = (
            inputs + n > settings.batch_max_inputs
            or count + len(requests) > 50_000
            or size + b > BATCH_MAX_BYTES
            or (max_tokens is not None and tokens + t > max_tokens)
        )
        if i > start and full:
            groups.append((start, i))
            start, inputs, count, size, tokens = i, 0, 0, 0, 0
        inputs, count, size, tokens = inputs + n, count + len(requests), size + b, tokens + t
    if start < len(parts):
        groups.append((start, len(parts)))
    return groups


@dataclass(slots=True)
class BatchResults:
    """What a chunk's batches answered, by ``custom_id``.

    ``vectors``: float32 ``(n_inputs, d)`` and the request's reported tokens;
    ``rejected``: (HTTP status, the server's message cut to 200 characters) of a request
    refused for its input (4xx but 429: a dead letter, as ``classify`` says);
    ``retry``: requests that failed for the server's reasons (5xx, 429, expired or cancelled
    before they ran): sent again; ``errors``: those of them the server ran and failed (5xx,
    429, 408, 409), not expired or cancelled before they ran.
    """

    vectors: dict[str, tuple[np.ndarray, int]] = field(default_factory=dict)
    rejected: dict[str, tuple[int, str]] = field(default_factory=dict)
    retry: set[str] = field(default_factory=set)
    errors: set[str] = field(default_factory=set)

    def add_output(
        self, content: bytes, *, dimensions: int | None, chunk: int | None = None
    ) -> None:
        """Read an output or error file (lines in any order, matched by ``custom_id``);
        ``chunk``: only that chunk's lines of a batch that packs several (``wire_id``), and
        lines without a chunk (a batch of one chunk).

        :raises BadResponseError: a 200 line whose body is not ``n`` vectors.
        """
        for record in parse_result_lines(content):
            custom_id = record["custom_id"]
            split = split_wire_id(custom_id)
            if split is not None:
                if chunk is not None and split[0] != chunk:
                    continue
                custom_id = split[2]
            response = record.get("response") or {}
            status = int(response.get("status_code") or 0)
            body = response.get("body")
            if status == 200 and isinstance(body, dict):
                n = len(body.get("data") or [])
                vectors, tokens = parse_embeddings(body, n, dimensions)
                self.vectors[custom_id] = (vectors, tokens)
                self.retry.discard(custom_id)
                self.errors.discard(custom_id)
                continue
            if custom_id in self.vectors:
                continue  # answered by another batch of the chunk
            error = record.get("error") or {}
            code = str(error.get("code") or "")
            if status and 400 <= status < 500 and status not in (408, 409, 429):
                message = str(((body or {}).get("error") or {}).get("message") or "")[:200]
                self.rejected[custom_id] = (status, message)
            elif code in _NOT_RUN_CODES or status >= 500 or status in (0, 408, 409, 429):
                self.retry.add(custom_id)
                if code not in _NOT_RUN_CODES and status:
                    self.errors.add(custom_id)

    def resolve(self, requests: Iterable[BatchRequest]) -> Resolved:
        """Texts answered and rejected, and the requests still to send, each once: a
        request neither answered nor rejected; the single-input requests of a request of
        several inputs that was rejected (which input the server refused is known only when
        each goes alone) or split to fit the enqueued-token budget (``fit``: a file answers
        one of its inputs alone)."""
        done = Resolved()
        todo = list(requests)
        seen: set[str] = set()  # a request listed twice (a part and a split of it): once
        while todo:
            request = todo.pop(0)
            if request.custom_id in seen:
                continue
            seen.add(request.custom_id)
            answer = self.vectors.get(request.custom_id)
            if answer is not None:
                vectors, tokens = answer
                n = len(request.texts)
                for i, text in enumerate(request.texts):
                    share = tokens // n + (1 if i < tokens % n else 0)
                    done.vectors[sent_text_sha256(text)] = (vectors[i], share)
            elif request.custom_id in self.rejected:
                if len(request.texts) == 1:
                    done.rejected[sent_text_sha256(request.texts[0])] = self.rejected[
                        request.custom_id
                    ]
                else:
                    todo[:0] = request.singles()
            elif len(request.texts) > 1 and any(self._known(s) for s in request.singles()):
                todo[:0] = request.singles()  # split to fit the token budget: sent one by one
            else:
                done.pending.append(request)
                if request.custom_id in self.errors:
                    done.errored.add(request.custom_id)
        return done

    def _known(self, request: BatchRequest) -> bool:
        """Whether a file answers ``request`` (a vector, a rejection or an error)."""
        return any(request.custom_id in k for k in (self.vectors, self.rejected, self.retry))


@dataclass(slots=True)
class Resolved:
    """``BatchResults.resolve``: by SHA-256 of the text as sent, its vector (float32
    ``(d,)``) and share of its request's tokens, or its rejection (HTTP status, message);
    and the requests still to send, each once (``errored``: the custom_ids of those the
    server ran and failed; the others expired or were cancelled before they ran, or no
    file names them)."""

    vectors: dict[str, tuple[np.ndarray, int]] = field(default_factory=dict)
    rejected: dict[str, tuple[int, str]] = field(default_factory=dict)
    pending: list[BatchRequest] = field(default_factory=list)
    errored: set[str] = field(default_factory=set)
