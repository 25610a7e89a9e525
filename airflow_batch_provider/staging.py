"""Staging through Airflow's ``ObjectStoragePath``.

``file://`` by default; ``s3://`` and ``gs://`` work the same way, with the connection that the
object store needs.

Layout: ``<root>/<workload>/<run key>/round-<k>/{chunk,output,errors}-<i>.jsonl``.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import IO, Any, Final, Literal

from airflow_batch_provider.core.hashing import short_hash
from airflow_batch_provider.core.names import check_workload
from airflow_batch_provider.exceptions import StagingError
from airflow_batch_provider.settings import default_staging_root, get_setting

_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")


def run_key(run_id: str) -> str:
    """Return a path- and id-safe key for an Airflow run id (readable prefix + hash).

    :param run_id: the Airflow run id
    """
    # Only [A-Za-z0-9_.-] survive, and the hash suffix means the key is never "." or "..".
    return f"{_UNSAFE.sub('-', run_id)[:40].strip('-')}-{short_hash(run_id, length=8)}"


class Staging:
    """Where chunks, downloads and reports live.

    :param root: a URL (``file:///...``, ``s3://bucket/prefix``, ``gs://...``); default from config
    :param conn_id: the object store connection (e.g. ``aws_default``) for non-local roots;
        default ``[batch_provider] staging_conn_id``
    """

    def __init__(self, root: str | None = None, conn_id: str | None = None) -> None:
        from airflow.sdk import ObjectStoragePath

        conn_id = conn_id or get_setting("staging_conn_id", "") or None
        self.root = ObjectStoragePath(root or default_staging_root(), conn_id=conn_id)
        self.conn_id = conn_id

    def at(self, url: str) -> Any:
        """Return a staged file's ``ObjectStoragePath`` from the URL the ledger recorded.

        :param url: e.g. ``s3://bucket/prefix/w/run/round-1/chunk-00000.jsonl``
        """
        from airflow.sdk import ObjectStoragePath

        return ObjectStoragePath(url, conn_id=self.conn_id)

    def path(self, *parts: str) -> Any:
        """Return ``root/part/...`` as an ``ObjectStoragePath``.

        :param parts: path parts
        """
        p = self.root
        for part in parts:
            p = p / part
        return p

    def run_dir(self, workload: str, run_id: str) -> Any:
        """Return the folder of one workload run, always inside the staging root.

        The workload must be a valid workload name (:func:`~airflow_batch_provider.core.names.check_workload`);
        the run id (``:``, ``+``, any character) maps to one safe folder name by :func:`run_key`.

        :param workload: workload name
        :param run_id: the Airflow run id
        :raises ConfigurationError: the workload is not a valid workload name
        """
        return self.path(check_workload(workload), run_key(run_id))

    def job_file(self, workload: str, run_id: str, round_number: int, chunk_index: int, kind: str) -> Any:
        """Return a job's file in its round folder: ``round-<k>/<kind>-<i>.jsonl`` (``chunk``, ``output``, ``errors``).

        :param workload: workload name
        :param run_id: the Airflow run id
        :param round_number: the job's round
        :param chunk_index: the job's chunk index
        :param kind: the file's kind
        """
        return self.run_dir(workload, run_id) / f"round-{round_number}" / f"{kind}-{chunk_index:05d}.jsonl"

    @contextmanager
    def writer(self, path: Any) -> Iterator[IO[bytes]]:
        """Open ``path`` for binary writing, creating parent folders.

        :param path: an ``ObjectStoragePath``
        """
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("wb") as fh:
            yield fh

    @staticmethod
    def sha256(path: Any) -> str:
        """Return the SHA-256 of a staged file, streaming.

        :param path: an ``ObjectStoragePath``
        """
        digest = hashlib.sha256()
        with path.open("rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                digest.update(block)
        return digest.hexdigest()

    def verify(self, path: Any, sha256: str) -> None:
        """Check that a staged file still has the checksum the ledger recorded.

        :param path: an ``ObjectStoragePath``
        :param sha256: expected hex digest
        :raises StagingError: missing or changed
        """
        if not path.exists():
            raise StagingError(
                f"staged chunk {path} is gone (expected sha256 {sha256[:12]}...); clear the prepare "
                "task of this run to stage it again."
            )
        found = self.sha256(path)
        if found != sha256:
            raise StagingError(
                f"staged chunk {path} changed since it was staged: sha256 {found[:12]}... but the ledger "
                f"recorded {sha256[:12]}...; nothing was submitted. Clear the prepare task to restage."
            )


#: Object stores whose staged files can be handed to a pod as presigned URLs.
PRESIGNABLE_PROTOCOLS: Final = frozenset({"s3", "s3a", "gs", "gcs"})
#: The longest a presigned URL may live: S3 (SigV4) and GCS (V4 signing) both refuse more than 7 days.
PRESIGN_MAX_S: Final = 7 * 24 * 3600


def presign(path: Any, method: Literal["GET", "PUT"], expires_s: int, conn_id: str | None) -> str:
    """A URL that lets its holder ``GET`` (read) or ``PUT`` (write) one staged object, and nothing else.

    Signed on the worker with the staging connection's credentials (S3: SigV4 through the Amazon
    provider's ``S3Hook``; GCS: V4 signing with the ``google_cloud_platform`` connection's
    service-account key), so whoever holds the URL (a pod) needs no credentials of its own. No
    content type is signed: the holder may send any (vLLM's upload sends
    ``application/octet-stream``).

    :param path: the object, an ``ObjectStoragePath`` on ``s3://`` or ``gs://``
    :param method: ``GET`` or ``PUT``
    :param expires_s: seconds the URL stays valid (1 to 7 days at most)
    :param conn_id: the object store connection (``None``: the SDK's default credentials)
    :raises StagingError: an object store that cannot presign, an expiry out of range, or
        credentials that cannot sign
    """
    protocol = str(getattr(path, "protocol", "") or "")
    if protocol not in PRESIGNABLE_PROTOCOLS:
        raise StagingError(
            f"{path}: only s3:// and gs:// objects can be presigned (this is {protocol or 'a local path'}); "
            "use an s3:// or gs:// staging root, or a volume the pod mounts."
        )
    if not 1 <= expires_s <= PRESIGN_MAX_S:
        raise StagingError(
            f"{path}: a presigned URL may live 1 to {PRESIGN_MAX_S} seconds (7 days), not {expires_s}."
        )
    bucket, key = str(path.bucket), str(path.key)
    if protocol.startswith("s3"):
        from airflow.providers.amazon.aws.hooks.s3 import S3Hook
        from botocore.config import Config

        client = S3Hook(aws_conn_id=conn_id).get_client_type(config=Config(signature_version="s3v4"))
        operation = "get_object" if method == "GET" else "put_object"
        return str(
            client.generate_presigned_url(
                operation, Params={"Bucket": bucket, "Key": key}, ExpiresIn=expires_s, HttpMethod=method
            )
        )
    from datetime import timedelta

    from google.cloud.storage import Client

    from airflow_batch_provider.hooks.google import credentials_from_extras, google_credentials

    if conn_id:
        credentials, project, endpoint = google_credentials(conn_id)
    else:
        credentials, project = credentials_from_extras({})
        endpoint = None
    client = Client(project=project or "_", credentials=credentials)
    blob = client.bucket(bucket).blob(key)
    try:
        return str(
            blob.generate_signed_url(
                version="v4",
                expiration=timedelta(seconds=expires_s),
                method=method,
                credentials=credentials,
                api_access_endpoint=endpoint or None,
            )
        )
    except AttributeError as exc:  # google-auth: credentials without a private key cannot sign
        raise StagingError(
            f"{path}: the credentials of connection {conn_id!r} cannot sign a URL ({exc}); give the "
            "google_cloud_platform connection a service-account key (keyfile_dict or key_path)."
        ) from exc
