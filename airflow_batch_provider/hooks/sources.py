"""A :class:`~airflow_batch_provider.services.sources_sql.SqlSource` read through its connection's hook.

The hook is the one the connection's type names (:mod:`airflow_batch_provider.hooks.sql`, shared
with the SQL sink). On PostgreSQL the rows come through one server-side cursor, a page per fetch
(:mod:`airflow_batch_provider.services.sources_sql_stream`); every other database is read in
keyset pages with the hook's parameter marker (:mod:`airflow_batch_provider.services.sources_sql`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import closing
from typing import Final

from airflow_batch_provider.hooks.sql import sql_connection_hook
from airflow_batch_provider.hooks.sql import sql_hook as sql_hook
from airflow_batch_provider.services.records import SourceRecord
from airflow_batch_provider.services.sources_sql import SqlPaging, SqlSource, read_sql
from airflow_batch_provider.services.sources_sql_stream import stream_sql

#: Connection types whose driver keeps a named cursor on the server (psycopg 3, psycopg2).
SERVER_CURSOR_TYPES: Final = frozenset({"postgres", "postgresql"})


def read_sql_source(
    source: SqlSource, id_field: str, paging: SqlPaging | None = None
) -> Iterator[SourceRecord]:
    """Read a SQL source through its connection's hook; the connection is closed when reading ends.

    :param source: the source (its ``sql`` already rendered)
    :param id_field: the prompt's id field
    :param paging: counts what was read, when given
    """
    hook, conn_type = sql_connection_hook(source.conn_id, "a SqlSource")
    with closing(hook.get_conn()) as conn:
        if conn_type.lower() in SERVER_CURSOR_TYPES:
            yield from stream_sql(conn, source, id_field=id_field, paging=paging)
        else:
            yield from read_sql(conn, source, placeholder=hook.placeholder, id_field=id_field, paging=paging)
