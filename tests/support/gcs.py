"""A GCS-compatible server on loopback (``gcp-storage-emulator``, pure Python, in memory).

Clients reach it the way they reach Google: over HTTP, with the JSON API's endpoint set to
:attr:`GCSServer.endpoint_url` (``gcsfs``: ``endpoint_url``; a ``google_cloud_platform``
connection: the extra ``gcs.endpoint``). Nothing leaves the machine; it checks no credentials.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

from tests.support.ports import LOOPBACK


@dataclass
class GCSServer:
    """A running GCS server; use as a context manager or call :meth:`stop`.

    :param port: the TCP port on 127.0.0.1
    :param server: the ``gcp_storage_emulator`` server
    """

    port: int
    server: Any = field(repr=False)
    host: str = LOOPBACK

    @property
    def endpoint_url(self) -> str:
        """The JSON API endpoint, e.g. ``http://127.0.0.1:PORT``."""
        return f"http://{self.host}:{self.port}"

    def create_bucket(self, name: str) -> None:
        """Create a bucket (the server starts with none).

        :param name: the bucket name
        """
        from gcp_storage_emulator.handlers import buckets

        buckets.create_bucket(name, self.server._storage)

    def stop(self) -> None:
        """Stop the server thread; idempotent."""
        if self.server is not None:
            self.server.stop()
            self.server = None

    def __enter__(self) -> GCSServer:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def start_gcs() -> GCSServer:
    """Start the server on a kernel-chosen loopback port (port 0 bound by the server itself).

    :return: the running server
    """
    from gcp_storage_emulator.server import create_server

    server = create_server(LOOPBACK, 0, in_memory=True)
    server.start()  # returns once the socket is bound
    port = int(server._api._httpd.server_address[1])
    return GCSServer(port=port, server=server)
