"""Connection -> the SQL hook a :class:`~airflow_batch_provider.services.sources_sql.SqlSource` reads through.

The connection's type names its hook (``postgres`` -> ``PostgresHook``, ``sqlite`` ->
``SqliteHook``, ``snowflake``, ``mysql`` ...), as Airflow's own SQL operators find it; the hook
must be a ``common.sql`` ``DbApiHook``, whose DB-API connection and parameter marker the
keyset pages use.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import closing
from typing import Any

from airflow_batch_provider.exceptions import ConfigurationError
from airflow_batch_provider.services.records import SourceRecord
from airflow_batch_provider.services.sources_sql import SqlPaging, SqlSource, read_sql


def sql_hook(conn_id: str) -> Any:
    """Return the ``DbApiHook`` the connection's type names.

    :param conn_id: the connection
    :raises ConfigurationError: the connection's hook is not a ``common.sql`` ``DbApiHook`` (or its
        provider is not installed); the message names the connection, its type and the fix
    """
    from airflow.providers.common.sql.hooks.sql import DbApiHook
    from airflow.sdk import BaseHook

    conn = BaseHook.get_connection(conn_id)
    try:
        hook = conn.get_hook()
    except Exception as exc:  # an unknown type, or its provider missing
        raise ConfigurationError(
            f"connection {conn_id!r} is of type {conn.conn_type!r}, whose hook could not be made ({exc}); a "
            "SqlSource reads through a SQL connection (postgres, sqlite, mysql, snowflake ...): install the "
            "type's provider (pip install 'airflow-batch-provider[sql]' brings postgres and sqlite) or use a "
            "connection of a SQL type."
        ) from exc
    if not isinstance(hook, DbApiHook):
        raise ConfigurationError(
            f"connection {conn_id!r} is of type {conn.conn_type!r}, whose hook {type(hook).__name__} is not a "
            "common.sql DbApiHook, so it cannot run a query; give SqlSource a connection of a SQL type "
            "(postgres, sqlite, mysql, snowflake ...)."
        )
    return hook


def read_sql_source(
    source: SqlSource, id_field: str, paging: SqlPaging | None = None
) -> Iterator[SourceRecord]:
    """Read a SQL source through its connection's hook; the connection is closed when reading ends.

    :param source: the source (its ``sql`` already rendered)
    :param id_field: the prompt's id field
    :param paging: counts what was read, when given
    """
    hook = sql_hook(source.conn_id)
    with closing(hook.get_conn()) as conn:
        yield from read_sql(conn, source, placeholder=hook.placeholder, id_field=id_field, paging=paging)
