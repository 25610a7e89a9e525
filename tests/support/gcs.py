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


def service_account_key(token_uri: str, project: str = "abp-project") -> dict[str, str]:
    """Return a service-account key file (a fresh RSA key) whose tokens come from ``token_uri``.

    ``google-auth`` signs a JWT with the key and posts it to ``token_uri``: the emulator's
    ``/token`` answers with a token its Vertex routes accept, so a test sees the connection's
    credentials used end to end.

    :param token_uri: e.g. ``http://127.0.0.1:PORT/token``
    :param project: the key's project id
    """
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    pem = (
        rsa.generate_private_key(public_exponent=65537, key_size=2048)
        .private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        .decode()
    )
    return {
        "type": "service_account",
        "project_id": project,
        "private_key_id": "k1",
        "private_key": pem,
        "client_email": f"batch@{project}.iam.gserviceaccount.com",
        "client_id": "1",
        "token_uri": token_uri,
    }


def vertex_connections(
    emulator_url: str, gcs_endpoint: str, gcs_prefix: str
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Return a ``google_cloud_platform`` connection (``abp_gcp``: a service-account key whose
    tokens come from the emulator, GCS at ``gcs_endpoint``) and a Vertex AI ``gemini_batch``
    connection that names it.

    :param emulator_url: the emulator's base URL
    :param gcs_endpoint: the GCS server's endpoint
    :param gcs_prefix: ``gs://bucket/folder`` of the Vertex input and output
    """
    import json

    gcp = {
        "conn_type": "google_cloud_platform",
        "extra": {
            "keyfile_dict": json.dumps(service_account_key(f"{emulator_url}/token")),
            "gcs.endpoint": gcs_endpoint,
        },
    }
    gemini = {
        "conn_type": "gemini_batch",
        "host": emulator_url,
        "extra": {
            "vertexai": True,
            "location": "us-central1",
            "gcs_prefix": gcs_prefix,
            "gcp_conn_id": "abp_gcp",
        },
    }
    return gcp, gemini
