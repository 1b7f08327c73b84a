"""Where the input CSV's bytes come from: a local file or an S3 object, streamed.

Planning reads the whole input once as a stream (S3: one ``GetObject``, never downloaded to
disk first); each chunk task then reads only its byte range (S3: a ranged ``GetObject`` with
``If-Match`` on the ETag seen at planning, so an object replaced mid-run is refused).

A ``.gz`` input (local or S3) is decompressed as a stream (``GzipInput``); its byte offsets
are offsets in the decompressed bytes. gzip cannot seek, so chunk reads go through a
``GzipIndex`` shared by every reader of the same file version in the process: zlib state
checkpoints every 4 MiB, so a run inflates the file about once, plus at most 4 MiB a chunk,
instead of ``chunks / 2`` times.
"""

from __future__ import annotations

import io
import os
import threading
import zlib
from collections.abc import Callable
from typing import Any, BinaryIO, Protocol, TypeVar

from adapters.gzip_index import GzipIndex, GzipStream, NotGzipData, TruncatedMember
from adapters.uris import split_location
from embedline.errors import EmbedlineError, InputError

__all__ = ["GzipInput", "InputFile", "LocalInput", "S3Input", "open_input"]

_INPUT_FORMS = "use a local path, file:///abs/path or s3://bucket/key"

_STREAM_BUFFER = 1 << 20  # bytes


class InputFile(Protocol):
    """A readable input: ``uri`` as given, ``name`` (file name), ``version`` (ETag or mtime)."""

    uri: str
    name: str

    def open(self) -> BinaryIO:
        """Return a buffered binary stream of the whole input (supports ``readline``)."""
        ...

    def read_range(self, start: int, stop: int) -> bytes:
        """Return bytes ``[start, stop)``. :raises InputError: unreadable or changed."""
        ...


class LocalInput:
    """A local file (a plain path or ``file://`` URI)."""

    def __init__(self, path: str) -> None:
        self.uri = os.path.abspath(path)
        self.name = os.path.basename(path)

    def open(self) -> BinaryIO:
        """:raises InputError: the file cannot be opened."""
        try:
            return open(self.uri, "rb", buffering=_STREAM_BUFFER)  # the caller closes it
        except OSError as exc:
            raise InputError(f"cannot open the input: {exc.strerror}", path=self.uri) from None

    def read_range(self, start: int, stop: int) -> bytes:
        """:raises InputError: the file cannot be read."""
        try:
            with open(self.uri, "rb") as fh:
                fh.seek(start)
                return fh.read(stop - start)
        except OSError as exc:
            raise InputError(f"cannot read the input: {exc.strerror}", path=self.uri) from None

    def open_at(self, offset: int) -> BinaryIO:
        """The file from byte ``offset``. :raises InputError: it cannot be opened."""
        stream = self.open()
        stream.seek(offset)
        return stream

    @property
    def version(self) -> str | None:
        """Size and modification time (ns): a rewritten file gets a new index."""
        try:
            info = os.stat(self.uri)
        except OSError:
            return None
        return f"{info.st_size}:{info.st_mtime_ns}"


class S3Input:
    """An S3 object ``s3://bucket/key``, read with the standard AWS configuration chain."""

    def __init__(self, bucket: str, key: str, *, client: Any = None) -> None:
        self.uri = f"s3://{bucket}/{key}"
        self.name = key.rsplit("/", 1)[-1]
        self.bucket, self.key = bucket, key
        self._client = client
        self.etag: str | None = None

    @property
    def client(self) -> Any:
        if self._client is None:
            from adapters.object_store import S3Store

            self._client = S3Store(self.bucket).client
        return self._client

    def open(self) -> BinaryIO:
        """Stream the object; remembers its ETag for later range reads.

        :raises InputError: no such bucket or key, or access denied.
        """
        extra = {"IfMatch": self.etag} if self.etag else {}
        response = self._call("get_object", Bucket=self.bucket, Key=self.key, **extra)
        self.etag = response.get("ETag")
        return io.BufferedReader(response["Body"], buffer_size=_STREAM_BUFFER)

    def read_range(self, start: int, stop: int) -> bytes:
        """:raises InputError: unreadable, or replaced since planning (ETag changed)."""
        if stop <= start:
            return b""
        extra = {"IfMatch": self.etag} if self.etag else {}
        response = self._call(
            "get_object",
            Bucket=self.bucket,
            Key=self.key,
            Range=f"bytes={start}-{stop - 1}",
            **extra,
        )
        return bytes(response["Body"].read())

    def open_at(self, offset: int) -> BinaryIO:
        """Stream the object from byte ``offset`` to its end (one ranged GET, pinned to the
        ETag seen at planning). :raises InputError: as ``read_range``."""
        extra = {"IfMatch": self.etag} if self.etag else {}
        response = self._call(
            "get_object", Bucket=self.bucket, Key=self.key, Range=f"bytes={offset}-", **extra
        )
        return io.BufferedReader(response["Body"], buffer_size=_STREAM_BUFFER)

    @property
    def version(self) -> str | None:
        """The ETag chunk reads are pinned to (None before the first read)."""
        return self.etag

    def _call(self, operation: str, **kwargs: Any) -> Any:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            return getattr(self.client, operation)(**kwargs)
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code", "")
            if code in ("PreconditionFailed", "412"):
                raise InputError(
                    "the input object changed while the run read it; rerun", path=self.uri
                ) from None
            raise InputError(
                f"cannot read the input ({code or 'error'}): check the bucket, key and credentials",
                path=self.uri,
            ) from None
        except (BotoCoreError, EmbedlineError) as exc:
            raise InputError(f"cannot read the input: {exc}", path=self.uri) from None


class GzipInput:
    """A gzip-compressed input (``….gz``), read as a decompressed stream of ``inner``.

    ``read_range`` offsets are in the decompressed bytes; it streams ``inner`` from its start
    (S3: pinned to the planning ETag) and skips to ``start`` in 1 MiB reads.
    """

    def __init__(self, inner: LocalInput | S3Input) -> None:
        self.inner = inner
        self.uri = inner.uri
        self.name = inner.name

    @property
    def etag(self) -> str | None:
        """The compressed object's ETag (S3), which chunk reads are pinned to."""
        return getattr(self.inner, "etag", None)

    def open(self) -> BinaryIO:
        """Return a buffered stream of the decompressed bytes.

        :raises InputError: the input cannot be opened.
        """
        return _GzipErrors(GzipStream(self.inner.open()), self.uri)

    def read_range(self, start: int, stop: int) -> bytes:
        """Decompressed bytes ``[start, stop)``, through the process's ``GzipIndex`` of this
        file version (``_index_for``).

        :raises InputError: unreadable, not gzip, or truncated.
        """
        index = _index_for(self.inner)
        try:
            return index.read_range(start, stop)
        except (OSError, EOFError, zlib.error, NotGzipData) as exc:
            raise _gzip_error(exc, self.uri) from None


def _gzip_error(exc: BaseException, uri: str) -> InputError:
    """The one-line error for a gzip input that cannot be decompressed."""
    if isinstance(exc, NotGzipData) and exc.offset > 0:
        return InputError(
            f"the bytes from compressed byte offset {exc.offset} on (after "
            f"{exc.decompressed} decompressed bytes) are neither a gzip member nor "
            "NUL padding: trailing data after the last member. Truncate the file "
            f"to its first {exc.offset} bytes (head -c {exc.offset}) or export "
            "it again",
            path=uri,
        )
    if isinstance(exc, TruncatedMember) and exc.offset > 0:
        return InputError(
            f"the last gzip member, from compressed byte offset {exc.offset} on, "
            "is cut short (a file half-written or half-uploaded after the "
            "others?). Truncate the file to its first "
            f"{exc.offset} bytes (head -c {exc.offset}) to keep the members "
            "before it, or export it again",
            path=uri,
        )
    return InputError(
        f"cannot decompress the input ({type(exc).__name__}: {exc}); is it really gzip?", path=uri
    )


_INDEXES: dict[tuple[str, str], GzipIndex] = {}
_INDEXES_LOCK = threading.Lock()
_INDEXES_KEPT = 4  # files; each index holds at most 512 checkpoints of ~40 KB


def _index_for(inner: LocalInput | S3Input) -> GzipIndex:
    """The index shared by all chunk reads of ``inner``'s current version in this process
    (a new, unshared one when the version is unknown)."""
    version = inner.version
    if version is None:
        return GzipIndex(inner.open_at)
    key = (inner.uri, version)
    with _INDEXES_LOCK:
        index = _INDEXES.pop(key, None) or GzipIndex(inner.open_at)
        _INDEXES[key] = index  # most recently used last
        while len(_INDEXES) > _INDEXES_KEPT:
            del _INDEXES[next(iter(_INDEXES))]
        return index


_T = TypeVar("_T")


class _GzipErrors(io.BufferedReader):
    """A buffered gzip stream whose corrupt-data errors become one-line ``InputError``s."""

    def __init__(self, raw: GzipStream, uri: str) -> None:
        super().__init__(raw, buffer_size=_STREAM_BUFFER)
        self._uri = uri

    def _wrap(self, call: Callable[..., _T], *args: Any) -> _T:
        try:
            return call(*args)
        except (OSError, EOFError, zlib.error, NotGzipData) as exc:
            raise _gzip_error(exc, self._uri) from None

    def read(self, size: int | None = -1) -> bytes:
        return self._wrap(super().read, size)

    def readline(self, size: int | None = -1) -> bytes:
        return self._wrap(super().readline, size)

    def peek(self, size: int = 0) -> bytes:
        return self._wrap(super().peek, size)


def open_input(uri: str, *, etag: str | None = None) -> LocalInput | S3Input | GzipInput:
    """Return the input at ``uri``: a local path, ``file:///abs/path`` or ``s3://bucket/key``.

    ``etag`` pins an S3 object to the version seen at planning.

    The S3 key and a plain path are kept exactly as written (``adapters.uris``).

    :raises InputError: an unsupported scheme or an S3 URI without bucket or key.
    """
    where = split_location(uri, what="input", forms=_INPUT_FORMS)
    found: LocalInput | S3Input
    if where.kind == "local":
        found = LocalInput(where.path)
    else:
        if not where.key or where.key.endswith("/"):
            raise InputError(f"input {uri!r}: expected s3://bucket/key.csv")
        found = S3Input(where.bucket, where.key)
        found.etag = etag
    return GzipInput(found) if found.uri.lower().endswith(".gz") else found
