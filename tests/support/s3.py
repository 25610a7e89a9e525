"""An S3-compatible server on loopback, run by moto in server mode (a real HTTP endpoint).

Clients reach it the way they reach AWS: over HTTP, with ``endpoint_url`` set to
:attr:`S3Server.endpoint_url`. Nothing leaves the machine; the credentials are dummies.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

from tests.support.ports import LOOPBACK, is_listening

DUMMY_AWS_ENV: Mapping[str, str] = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SESSION_TOKEN": "testing",
    "AWS_SECURITY_TOKEN": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_REGION": "us-east-1",
}
# variables that would make boto3 look for real credentials or another endpoint
MASKED_AWS_ENV = ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3")


@dataclass
class S3Server:
    """A running moto server; use as a context manager or call :meth:`stop`.

    :param port: the TCP port on 127.0.0.1.
    :param server: the ``moto.server.ThreadedMotoServer`` instance.
    """

    port: int
    server: Any = field(repr=False)
    host: str = LOOPBACK

    @property
    def endpoint_url(self) -> str:
        """The HTTP endpoint to pass as ``endpoint_url`` to boto3 / aiobotocore."""
        return f"http://{self.host}:{self.port}"

    def stop(self) -> None:
        """Stop the server thread; idempotent."""
        if self.server is not None:
            self.server.stop()
            self.server = None

    def __enter__(self) -> S3Server:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def start_s3(timeout: float = 15.0) -> S3Server:
    """Start moto's threaded server on a kernel-chosen loopback port and wait until it answers.

    Port 0 is bound directly (no :func:`free_port` race: moto's ``start()`` would wait forever if
    its thread failed to bind).

    :param timeout: seconds to wait for the port to accept connections.
    :raises RuntimeError: when the server does not come up.
    :return: the running server.
    """
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address=LOOPBACK, port=0, verbose=False)
    server.start()
    _, port = server.get_host_and_port()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if is_listening(port):
            return S3Server(port=port, server=server)
        time.sleep(0.05)
    server.stop()
    raise RuntimeError(f"moto S3 server on port {port} did not listen within {timeout}s")


@contextlib.contextmanager
def dummy_aws_env(extra: Mapping[str, str] | None = None) -> Iterator[dict[str, str]]:
    """Set dummy AWS credentials and region in ``os.environ``; restore the previous values on exit.

    Also points ``AWS_CONFIG_FILE`` / ``AWS_SHARED_CREDENTIALS_FILE`` at a path that does not exist,
    so a developer's ``~/.aws`` is never read, and masks profile and endpoint variables.

    :param extra: more variables to set.
    :return: an iterator yielding the variables that were set.
    """
    missing = os.path.join(os.sep, "nonexistent", "abp-tests", "aws")
    values = {
        **DUMMY_AWS_ENV,
        "AWS_CONFIG_FILE": f"{missing}/config",
        "AWS_SHARED_CREDENTIALS_FILE": f"{missing}/credentials",
        **(extra or {}),
    }
    names = set(values) | set(MASKED_AWS_ENV)
    saved = {name: os.environ.get(name) for name in names}
    try:
        for name in MASKED_AWS_ENV:
            os.environ.pop(name, None)
        os.environ.update(values)
        yield dict(values)
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
