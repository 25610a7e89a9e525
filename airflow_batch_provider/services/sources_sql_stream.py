"""A SQL source read through one server-side cursor: one ordered statement, a page per fetch.

Where the driver keeps a cursor on the server (PostgreSQL: a named cursor, ``DECLARE ... CURSOR``
then ``FETCH FORWARD n``, in psycopg 3 and psycopg2 alike), the source is one statement,
``SELECT ... ORDER BY id NULLS LAST``, read ``page_size`` rows per fetch: the task holds one page,
whatever the table's size, and the database runs the query once instead of once per keyset page
(:mod:`airflow_batch_provider.services.sources_sql`, the portable way, which every other database
gets). The records and rejects are the keyset read's: rows in id order, a repeated id is the
item once and ``duplicate_id`` rejects after it (the equal ids are adjacent), and the rows with a
NULL id come last, each a ``missing_id`` reject naming its row. A retried prepare reads the same
rows in the same order.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, Final

from airflow_batch_provider.exceptions import RecordSourceError
from airflow_batch_provider.services.records import SourceRecord
from airflow_batch_provider.services.source_values import row_record
from airflow_batch_provider.services.sources_sql import Connection, SqlPaging, SqlSource, select_parts

#: The server-side cursor's name (one per connection; the reading connection is the source's own).
CURSOR_NAME: Final = "abp_source"


def stream_query(source: SqlSource, id_column: str) -> str:
    """The one statement a server-side read runs: the rows in id order, the NULL ids last.

    :param source: the source (its ``sql`` already rendered)
    :param id_column: the id column
    """
    wanted, base = select_parts(source, id_column)
    return f"SELECT {wanted} FROM {base} ORDER BY {id_column} NULLS LAST"


def stream_sql(
    conn: Connection, source: SqlSource, *, id_field: str, paging: SqlPaging | None = None
) -> Iterator[SourceRecord]:
    """Read a SQL source's rows as records through a named (server-side) cursor, a page per fetch.

    :param conn: an open DB-API connection whose ``cursor(name=...)`` is a server-side cursor, in a
        transaction (not autocommit); the caller closes it
    :param source: the source (its ``sql`` already rendered)
    :param id_field: the prompt's id field (the id column's value is given under it too)
    :param paging: counts what was read, when given
    """
    id_column = source.id_column or id_field
    counts = paging if paging is not None else SqlPaging()
    sql = stream_query(source, id_column)
    cursor: Any = conn.cursor(name=CURSOR_NAME)  # type: ignore[call-arg]
    cursor.itersize = source.page_size
    counts.queries.append(sql)
    try:
        cursor.execute(sql)
        position = 0
        page = 0
        key = -1
        names: list[str] = []
        while True:
            rows: Sequence[Sequence[Any]] = cursor.fetchmany(source.page_size)
            if not rows:
                return
            page += 1
            counts.pages = page
            counts.largest_page = max(counts.largest_page, len(rows))
            if not names:  # psycopg2 describes a named cursor's columns after its first fetch
                names = [d[0] for d in cursor.description]
                if id_column not in names:
                    raise RecordSourceError(
                        f"{source.describe()} has no column {id_column!r} (its columns are {names}); name the "
                        "id column with SqlSource(id_column=...) or select it in the query."
                    )
                key = names.index(id_column)
            for index, row in enumerate(rows, start=1):
                value = row[key]
                where = f"page {page}, row {index} " + (
                    f"({id_column} {value!r})" if value is not None else "with a NULL id"
                )
                yield row_record(
                    dict(zip(names, row, strict=True)),
                    id_column=id_column,
                    id_field=id_field,
                    position=position,
                    where=where,
                )
                position += 1
    finally:
        cursor.close()
