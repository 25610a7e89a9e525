"""What a source or a sink reads or writes, and its OpenLineage name: no Airflow here.

Each source and sink declares its dataset once, as a :class:`DatasetRef` (a table or a query
through a connection, or a file's path or URL); :mod:`airflow_batch_provider.operators.lineage`
turns the refs of a task into the datasets Airflow's OpenLineage provider reports. The names follow
the OpenLineage naming spec (``namespace`` = the datasource, ``name`` = the dataset in it):

- a local file: namespace ``file``, name its absolute path; a file on another host (``file://host/p``):
  ``file://host``;
- an object: ``s3://{bucket}`` (``s3a``, ``s3n`` too) or ``gs://{bucket}`` (``gcs`` too), name the
  object key; any other URL: ``{scheme}://{host}[:{port}]``, name its path;
- a table: the namespace and name the connection's ``common.sql`` hook gives the provider
  (``postgres://{host}:{port}``, ``{database}.{schema}.{table}``); a hook that gives none (SQLite)
  gets :func:`datasource_of`'s.

A namespace never holds a URL's user, password, query or fragment: only the scheme, host and port
(and the container of an Azure URL, which the spec names as ``{container}@{account host}``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Final, Literal
from urllib.parse import urlsplit

#: What a dataset is: a table (``schema.table``), a query's tables, or a file (a path or URL).
DatasetKind = Literal["table", "query", "path"]

#: Object stores whose namespace is ``{scheme}://{bucket}``, each under the spec's scheme.
BUCKET_SCHEMES: Final = {"s3": "s3", "s3a": "s3", "s3n": "s3", "gs": "gs", "gcs": "gs"}
#: Azure stores whose namespace keeps the container before the ``@``.
CONTAINER_SCHEMES: Final = frozenset({"abfs", "abfss", "wasb", "wasbs"})
#: The schema SQLite gives a table named without one.
SQLITE_SCHEMA: Final = "main"


@dataclass(frozen=True)
class DatasetRef:
    """A source's or a sink's dataset, as declared (its text may be a template, rendered at run time).

    :param kind: ``table``, ``query`` or ``path``
    :param text: the table (``schema.table`` allowed), the query, or the path or URL
    :param conn_id: the SQL connection of a table or query
    """

    kind: DatasetKind
    text: str
    conn_id: str | None = None


@dataclass(frozen=True)
class DatasetName:
    """A dataset's OpenLineage identity.

    :param namespace: the datasource (``file``, ``s3://bucket``, ``postgres://host:5432``)
    :param name: the dataset within it (a path, an object key, ``db.schema.table``)
    """

    namespace: str
    name: str


@dataclass(frozen=True)
class Datasource:
    """A SQL datasource whose hook names none for OpenLineage: the namespace's parts and the default schema.

    :param scheme: the namespace's scheme (the connection's type)
    :param authority: ``host[:port]``, or the database file's absolute path for SQLite (``None``: no host)
    :param default_schema: the schema of a table named without one
    """

    scheme: str
    authority: str | None
    default_schema: str | None


def path_dataset(path: str) -> DatasetName:
    """The OpenLineage name of a file: a local path, or a ``file``, object-store or other URL.

    :param path: the rendered path or URL (``/data/in.jsonl``, ``s3://bucket/key.parquet``)
    """
    if "://" not in path:
        return DatasetName("file", os.path.abspath(path))
    parts = urlsplit(path)
    scheme = parts.scheme.lower()
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    if scheme == "file":
        return DatasetName(f"file://{host}" if host else "file", parts.path or "/")
    if scheme in BUCKET_SCHEMES:
        return DatasetName(f"{BUCKET_SCHEMES[scheme]}://{host}", parts.path.lstrip("/") or "/")
    if scheme in CONTAINER_SCHEMES and parts.username:
        host = f"{parts.username}@{host}"
    return DatasetName(f"{scheme}://{host}", parts.path or "/")


def datasource_of(conn_type: str, host: str | None, port: int | None) -> Datasource:
    """The datasource of a SQL connection whose hook gives OpenLineage no database info (SQLite ...).

    SQLite's host is the database file: ``sqlite:///abs/path.db`` names it, its tables in the ``main``
    schema. Any other type: ``{type}://{host}[:{port}]`` (never the login or password).

    :param conn_type: the connection's type
    :param host: its host (SQLite: the database file)
    :param port: its port
    """
    scheme = conn_type.lower()
    if scheme == "sqlite":
        return Datasource(scheme, os.path.abspath(host) if host else None, SQLITE_SCHEMA)
    authority = f"{host}:{port}" if host and port else host or None
    return Datasource(scheme, authority, None)
