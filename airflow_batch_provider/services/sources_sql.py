"""Records from a SQL table or query, streamed in keyset pages on the id column.

No Airflow here: the prepare operator resolves the connection's hook
(:func:`airflow_batch_provider.hooks.sql.sql_hook`) and hands its DB-API connection in.

The portable way to stream any SQL source without the whole result in memory is keyset paging:
the user's query is wrapped as a subquery and read ``page_size`` rows at a time, ordered by the
id column, each page starting after the last id of the one before
(``WHERE id > :last ORDER BY id LIMIT n``). The task holds one page at a time, and a retried
prepare reads the same rows in the same order. Two cases the keyset alone would lose are read
on their own, so that every row is a record or a reject and the counts add up:

- rows with a NULL id (``id > :last`` never selects them) are read after the pages, and each is
  a ``missing_id`` reject naming its row;
- a full page that ends inside a run of rows with the same id: that id's rows are read by a
  statement of their own before the next page (the first is the item, the others
  ``duplicate_id`` rejects, as in a file), each once. Which rows of the page belong to that run
  is the database's equality, not Python's: under a collation that holds ``'a' = 'A'`` (MySQL's
  and MariaDB's defaults, SQLite's ``NOCASE``), a text id's run is looked up first (its ids only),
  so that no row of it is read twice.

The id column should be unique and indexed (a primary key): each page is then an index range scan.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from airflow_batch_provider.core.lineage import DatasetRef
from airflow_batch_provider.exceptions import ConfigurationError
from airflow_batch_provider.services.records import SourceRecord
from airflow_batch_provider.services.source_values import IDENTIFIER_PATTERN, row_record

#: The subquery's alias (no ``AS``: Oracle does not take it before a table alias).
ALIAS = "abp_source"


@dataclass(frozen=True)
class SqlSource:
    """The records of a table or a query, read through an Airflow SQL connection.

    Pass it as ``records=``. ``sql`` (and ``table``) are Jinja-templated with the task context.

    :param conn_id: the connection; its type names the hook (a ``common.sql`` ``DbApiHook``)
    :param sql: a query; wrapped as a subquery, so it may not end with ``ORDER BY ... LIMIT``
        of its own that the paging would contradict (one without a ``LIMIT`` is fine)
    :param table: a table (or ``schema.table``), instead of ``sql``
    :param id_column: the column that holds the application id (default: the prompt's ``id_field``)
    :param columns: the columns read besides the id (default: all of them)
    :param page_size: rows per page: the most the task holds at once
    """

    conn_id: str
    sql: str | None = None
    table: str | None = None
    id_column: str | None = None
    columns: Sequence[str] | None = None
    page_size: int = 10_000

    def __post_init__(self) -> None:
        if (self.sql is None) == (self.table is None):
            raise ConfigurationError(
                f"SqlSource(conn_id={self.conn_id!r}) needs exactly one of sql= or table=; give the query "
                "or the table whose rows are the records."
            )
        if self.sql is not None and not self.sql.strip().rstrip(";").strip():
            raise ConfigurationError(f"SqlSource(conn_id={self.conn_id!r}): sql= is empty; give the query.")
        if self.page_size < 1:
            raise ConfigurationError(
                f"SqlSource(conn_id={self.conn_id!r}): page_size={self.page_size} is below 1; give the "
                "number of rows read per page (e.g. 10000)."
            )
        names = [("id_column", self.id_column), *(("columns", c) for c in self.columns or ())]
        if self.table is not None and "{" not in self.table:
            names.append(("table", self.table))
        for what, name in names:
            if name is not None and not re.match(IDENTIFIER_PATTERN, name):
                raise ConfigurationError(
                    f"SqlSource(conn_id={self.conn_id!r}): {what} {name!r} is not a plain SQL name; give a "
                    "column or table name (letters, digits, _), or alias the column in sql=."
                )

    @property
    def dataset(self) -> DatasetRef:
        """What it reads, for lineage: the table, or the tables of the query (templates unrendered)."""
        if self.table is not None:
            return DatasetRef("table", self.table, self.conn_id)
        return DatasetRef("query", self.sql or "", self.conn_id)

    def describe(self) -> str:
        """The source in words, for messages."""
        what = f"table {self.table}" if self.table is not None else "query"
        return f"SqlSource({what} through connection {self.conn_id!r})"


class Cursor(Protocol):
    """The part of a DB-API cursor this module uses."""

    description: Any

    def execute(self, operation: str, parameters: Sequence[Any] = ..., /) -> Any:
        """Run one statement.

        :param operation: the statement
        :param parameters: its parameters
        """

    def fetchall(self) -> Sequence[Sequence[Any]]:
        """The rows the statement returned."""

    def fetchmany(self, size: int = ..., /) -> Sequence[Sequence[Any]]:
        """At most ``size`` more rows.

        :param size: how many
        """

    def close(self) -> None:
        """Close the cursor."""


class Connection(Protocol):
    """The part of a DB-API connection this module uses."""

    def cursor(self) -> Any:
        """A new cursor."""


@dataclass
class SqlPaging:
    """What reading a SQL source did, counted (the paging test and the log read it).

    :param pages: keyset pages read
    :param largest_page: the most rows one fetch returned
    :param queries: statements run
    """

    pages: int = 0
    largest_page: int = 0
    queries: list[str] = field(default_factory=list)


def select_parts(source: SqlSource, id_column: str) -> tuple[str, str]:
    """What a read of the source selects and from where: ``(columns, table or wrapped query)``.

    :param source: the source (its ``sql`` already rendered)
    :param id_column: the id column
    """
    query = (source.sql or "").strip().rstrip(";")
    base = source.table if source.table is not None else f"({query}) {ALIAS}"
    wanted = (
        "*"
        if source.columns is None
        else ", ".join([id_column, *(c for c in source.columns if c != id_column)])
    )
    return wanted, base


def page_queries(source: SqlSource, id_column: str, placeholder: str) -> tuple[str, str, str, str, str]:
    """The statements a SQL source is read with: first page, next page, one id's rows, NULL ids, one id's ids.

    The last is the ids the database holds equal to one (a text id's run, under its collation).
    The second, third and fifth take the last id as a parameter. With a ``%s`` marker (the ``format``
    and ``pyformat`` drivers: psycopg, MySQL) a ``%`` of the user's own query (``LIKE 'a%'``) is
    doubled in those three, as the driver then reads every ``%`` as the start of a marker.

    :param source: the source (its ``sql`` already rendered)
    :param id_column: the id column
    :param placeholder: the driver's parameter marker (``%s``, ``?``)
    """
    wanted, base = select_parts(source, id_column)
    with_params = base.replace("%", "%%") if placeholder == "%s" else base
    limit = f"ORDER BY {id_column} LIMIT {int(source.page_size)}"
    return (
        f"SELECT {wanted} FROM {base} WHERE {id_column} IS NOT NULL {limit}",
        f"SELECT {wanted} FROM {with_params} WHERE {id_column} > {placeholder} {limit}",
        f"SELECT {wanted} FROM {with_params} WHERE {id_column} = {placeholder}",
        f"SELECT {wanted} FROM {base} WHERE {id_column} IS NULL",
        f"SELECT {id_column} FROM {with_params} WHERE {id_column} = {placeholder}",
    )


def read_sql(
    conn: Connection,
    source: SqlSource,
    *,
    placeholder: str,
    id_field: str,
    paging: SqlPaging | None = None,
) -> Iterator[SourceRecord]:
    """Read a SQL source's rows as records, one keyset page at a time.

    :param conn: an open DB-API connection (the caller closes it)
    :param source: the source (its ``sql`` already rendered)
    :param placeholder: the driver's parameter marker (the hook's ``placeholder``)
    :param id_field: the prompt's id field (the id column's value is given under it too)
    :param paging: counts what was read, when given
    """
    id_column = source.id_column or id_field
    first, after, same_id, null_ids, equal_ids = page_queries(source, id_column, placeholder)
    counts = paging if paging is not None else SqlPaging()
    position = 0

    def run(sql: str, params: Sequence[Any] = ()) -> tuple[Any, list[str]]:
        cursor = conn.cursor()
        counts.queries.append(sql)
        cursor.execute(sql, tuple(params)) if params else cursor.execute(sql)
        return cursor, [d[0] for d in cursor.description]

    def record(names: list[str], row: Sequence[Any], where: str) -> SourceRecord:
        return row_record(
            dict(zip(names, row, strict=True)),
            id_column=id_column,
            id_field=id_field,
            position=position,
            where=where,
        )

    last: Any = None
    page = 0
    while True:
        cursor, names = run(first) if page == 0 else run(after, (last,))
        try:
            rows = cursor.fetchall()
        finally:
            cursor.close()
        if not rows:
            break
        page += 1
        counts.pages = page
        counts.largest_page = max(counts.largest_page, len(rows))
        if id_column not in names:
            from airflow_batch_provider.exceptions import RecordSourceError

            raise RecordSourceError(
                f"{source.describe()} has no column {id_column!r} (its columns are {names}); name the id "
                "column with SqlSource(id_column=...) or select it in the query."
            )
        key = names.index(id_column)
        last = rows[-1][key]
        full = len(rows) == source.page_size
        # A full page may end inside a run of rows sharing its last id (the next page starts after
        # that id): the id's rows are all read by a statement of their own instead, so that each
        # is read once, whatever order the database returns equal ids in. A text id's run is the
        # ids its collation holds equal ('a' and 'A' under MySQL's default): looked up first.
        keep = rows
        if full and isinstance(last, str):
            cursor, _ = run(equal_ids, (last,))
            try:
                run_ids = {row[0] for row in _batches(cursor, source.page_size)}
            finally:
                cursor.close()
            keep = [row for row in rows if row[key] not in run_ids]
        elif full:
            keep = [row for row in rows if row[key] != last]
        for index, row in enumerate(keep, start=1):
            yield record(names, row, f"page {page}, row {index} ({id_column} {row[key]!r})")
            position += 1
        if not full:
            break
        cursor, names = run(same_id, (last,))
        try:
            for index, row in enumerate(_batches(cursor, source.page_size), start=len(keep) + 1):
                yield record(names, row, f"page {page}, row {index} ({id_column} {last!r})")
                position += 1
        finally:
            cursor.close()
    cursor, names = run(null_ids)
    try:
        for index, row in enumerate(_batches(cursor, source.page_size), start=1):
            yield record(names, row, f"row {index} with a NULL id")
            position += 1
    finally:
        cursor.close()


def _batches(cursor: Cursor, size: int) -> Iterator[Sequence[Any]]:
    while True:
        rows = cursor.fetchmany(size)
        if not rows:
            return
        yield from rows
