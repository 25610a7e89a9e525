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
from typing import IO, Any

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
