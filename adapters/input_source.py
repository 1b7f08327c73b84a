"""Where the input CSV's bytes come from: a local file or an S3 object, streamed.

Planning reads the whole input once as a stream (S3: one ``GetObject``, never downloaded to
disk first); each chunk task then reads only its byte range (S3: a ranged ``GetObject`` with
``If-Match`` on the ETag seen at planning, so an object replaced mid-run is refused).
"""

from __future__ import annotations

import io
import os
from typing import Any, BinaryIO, Protocol
from urllib.parse import unquote, urlsplit

from embedline.errors import EmbedlineError, InputError

__all__ = ["InputFile", "LocalInput", "S3Input", "open_input"]

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
            return open(self.uri, "rb")  # noqa: SIM115 - the caller closes it
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
        response = self._call("get_object", Bucket=self.bucket, Key=self.key)
        self.etag = response.get("ETag")
        return io.BufferedReader(response["Body"], buffer_size=_STREAM_BUFFER)

    def read_range(self, start: int, stop: int) -> bytes:
        """:raises InputError: unreadable, or replaced since planning (ETag changed)."""
        if stop <= start:
            return b""
        extra = {"IfMatch": self.etag} if self.etag else {}
        response = self._call("get_object", Bucket=self.bucket, Key=self.key,
                              Range=f"bytes={start}-{stop - 1}", **extra)  # fmt: skip
        return bytes(response["Body"].read())

    def _call(self, operation: str, **kwargs: Any) -> Any:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            return getattr(self.client, operation)(**kwargs)
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code", "")
            if code in ("PreconditionFailed", "412"):
                raise InputError("the input object changed while the run read it; rerun",
                                 path=self.uri) from None  # fmt: skip
            raise InputError(f"cannot read the input ({code or 'error'}): check the bucket, "
                             "key and credentials", path=self.uri) from None  # fmt: skip
        except (BotoCoreError, EmbedlineError) as exc:
            raise InputError(f"cannot read the input: {exc}", path=self.uri) from None


def open_input(uri: str, *, etag: str | None = None) -> LocalInput | S3Input:
    """Return the input at ``uri``: a local path, ``file:///abs/path`` or ``s3://bucket/key``.

    ``etag`` pins an S3 object to the version seen at planning.

    :raises InputError: an unsupported scheme or an S3 URI without bucket or key.
    """
    parts = urlsplit(uri)
    scheme = parts.scheme.lower()
    if scheme in ("", "file") or (len(scheme) == 1 and os.name == "nt"):
        return LocalInput(unquote(parts.path) if scheme == "file" else uri)
    if scheme == "s3":
        key = unquote(parts.path.lstrip("/"))
        if not parts.netloc or not key:
            raise InputError(f"input {uri!r}: expected s3://bucket/key.csv")
        found = S3Input(parts.netloc, key)
        found.etag = etag
        return found
    raise InputError(f"input {uri!r}: unsupported scheme {scheme!r}; use a local path, "
                     "file:///abs/path or s3://bucket/key")  # fmt: skip
