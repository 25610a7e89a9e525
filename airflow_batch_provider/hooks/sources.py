"""A :class:`~airflow_batch_provider.services.sources_sql.SqlSource` read through its connection's hook.

The hook is the one the connection's type names (:mod:`airflow_batch_provider.hooks.sql`, shared
with the SQL sink); its DB-API connection and parameter marker are what the keyset pages use.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import closing

from airflow_batch_provider.hooks.sql import sql_hook as sql_hook
from airflow_batch_provider.services.records import SourceRecord
from airflow_batch_provider.services.sources_sql import SqlPaging, SqlSource, read_sql


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
