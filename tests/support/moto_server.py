"""A loopback moto S3 server for tests, and pytest fixtures around it.

Use from ``tests/conftest.py``::

    from tests.support.moto_server import moto_endpoint, s3_bucket, s3_client  # noqa: F401

- ``moto_endpoint`` (session): starts ``ThreadedMotoServer(ip_address="127.0.0.1", port=0)``
  (its default address is 0.0.0.0: moto/moto_server/threaded_moto_server.py), puts dummy
  credentials and a region in ``os.environ`` for the session (restored afterwards) and
  returns ``http://127.0.0.1:PORT``. It does not set ``AWS_ENDPOINT_URL`` globally: pass the
  endpoint explicitly, or ``monkeypatch.setenv("AWS_ENDPOINT_URL", moto_endpoint)``.
- ``s3_client`` (function): a boto3 S3 client pointed at that endpoint.
- ``s3_bucket`` (function): a fresh, uniquely named bucket on the server.

Subprocesses (the CLI under test) reach the server with ``env=moto_env(moto_endpoint)``:
boto3 reads ``AWS_ENDPOINT_URL`` (and ``AWS_ENDPOINT_URL_S3``) itself, see botocore
``EndpointConfigProvider``; tests/integration/test_object_store_s3.py checks that it works.

If the root conftest clears ``AWS_*`` variables per test (like httpx's ``clean_environ``), it
must run before these fixtures re-apply ``DUMMY_AWS_ENV`` or leave those variables alone.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

__all__ = [
    "DUMMY_AWS_ENV",
    "MotoS3Server",
    "moto_endpoint",
    "moto_env",
    "s3_bucket",
    "s3_client",
]

#: Credentials moto accepts; never real ones. Shared config files are pointed at /dev/null
#: and IMDS is disabled so no real profile, role or network lookup can leak in.
DUMMY_AWS_ENV: dict[str, str] = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SESSION_TOKEN": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_REGION": "us-east-1",
    "AWS_CONFIG_FILE": os.devnull,
    "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
    "AWS_EC2_METADATA_DISABLED": "true",
}
#: Variables removed for the session: they could point boto3 at a real account or endpoint.
_REMOVED_AWS_ENV = (
    "AWS_PROFILE",
    "AWS_DEFAULT_PROFILE",
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_S3",
    "AWS_ROLE_ARN",
    "AWS_WEB_IDENTITY_TOKEN_FILE",
)


class MotoS3Server:
    """A ``ThreadedMotoServer`` on ``host`` (127.0.0.1 unless told) and an ephemeral port; use
    as a context manager."""

    def __init__(self, host: str = "127.0.0.1") -> None:
        from moto.server import ThreadedMotoServer

        self._server = ThreadedMotoServer(ip_address=host, port=0, verbose=False)
        self.endpoint = ""

    def start(self) -> str:
        """Start the server; return its endpoint URL ``http://HOST:PORT``."""
        self._server.start()
        host, port = self._server.get_host_and_port()
        self.endpoint = f"http://{host}:{port}"
        return self.endpoint

    def stop(self) -> None:
        """Stop the server and join its thread."""
        self._server.stop()

    def __enter__(self) -> MotoS3Server:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def moto_env(endpoint: str, base: dict[str, str] | None = None) -> dict[str, str]:
    """Return an environment for a child process that talks to the moto server.

    ``base`` defaults to ``os.environ``; every ``AWS_*`` variable in it is dropped first,
    then ``DUMMY_AWS_ENV`` and ``AWS_ENDPOINT_URL=endpoint`` are added.
    """
    env = {
        k: v for k, v in (os.environ if base is None else base).items() if not k.startswith("AWS_")
    }
    env.update(DUMMY_AWS_ENV)
    env["AWS_ENDPOINT_URL"] = endpoint
    return env


def make_s3_client(endpoint: str, **config: Any) -> Any:
    """Return a boto3 S3 client for ``endpoint`` (botocore ``Config`` options in ``config``)."""
    import boto3
    from botocore.config import Config

    return boto3.session.Session().client(
        "s3",
        endpoint_url=endpoint,
        region_name=DUMMY_AWS_ENV["AWS_DEFAULT_REGION"],
        config=Config(**config) if config else None,
    )


@pytest.fixture(scope="session")
def moto_endpoint() -> Iterator[str]:
    """Session-wide moto S3 server on loopback; yields ``http://127.0.0.1:PORT``."""
    with pytest.MonkeyPatch.context() as mp:
        for name in _REMOVED_AWS_ENV:
            mp.delenv(name, raising=False)
        for name, value in DUMMY_AWS_ENV.items():
            mp.setenv(name, value)
        with MotoS3Server() as server:
            yield server.endpoint


@pytest.fixture
def s3_client(moto_endpoint: str) -> Iterator[Any]:
    """A boto3 S3 client pointed at the moto server."""
    client = make_s3_client(moto_endpoint)
    yield client
    client.close()


@pytest.fixture
def s3_bucket(s3_client: Any) -> str:
    """Create and return a fresh bucket ``embedline-test-{12 hex}`` on the moto server."""
    name = f"embedline-test-{uuid.uuid4().hex[:12]}"
    s3_client.create_bucket(Bucket=name)
    return name
