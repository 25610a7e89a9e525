"""Connection -> the ``common.sql`` hook its type names, for the SQL sources and sinks.

The connection's type names its hook (``postgres`` -> ``PostgresHook``, ``sqlite`` ->
``SqliteHook``, ``snowflake``, ``mysql`` ...), as Airflow's own SQL operators find it; the hook
must be a ``common.sql`` ``DbApiHook`` (its DB-API connection and parameter marker are what the
keyset pages and the sink's statements use).
"""

from __future__ import annotations

from typing import Any

from airflow_batch_provider.exceptions import ConfigurationError


def sql_connection_hook(conn_id: str, used_by: str) -> tuple[Any, str]:
    """Return the ``DbApiHook`` the connection's type names, and that type.

    :param conn_id: the connection
    :param used_by: what reads or writes through it, for the messages (``a SqlSource`` ...)
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
            f"connection {conn_id!r} is of type {conn.conn_type!r}, whose hook could not be made ({exc}); "
            f"{used_by} goes through a SQL connection (postgres, sqlite, mysql, snowflake ...): install the "
            "type's provider (pip install 'airflow-batch-provider[sql]' brings postgres and sqlite) or use a "
            "connection of a SQL type."
        ) from exc
    if not isinstance(hook, DbApiHook):
        raise ConfigurationError(
            f"connection {conn_id!r} is of type {conn.conn_type!r}, whose hook {type(hook).__name__} is not a "
            f"common.sql DbApiHook, so it cannot run a query; give {used_by} a connection of a SQL type "
            "(postgres, sqlite, mysql, snowflake ...)."
        )
    return hook, str(conn.conn_type or "")


def sql_hook(conn_id: str) -> Any:
    """Return the ``DbApiHook`` a SQL source's connection names (see :func:`sql_connection_hook`).

    :param conn_id: the connection
    :raises ConfigurationError: see :func:`sql_connection_hook`
    """
    return sql_connection_hook(conn_id, "a SqlSource")[0]
