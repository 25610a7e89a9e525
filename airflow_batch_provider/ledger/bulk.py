"""The ledger's bulk-writes room: slices, key filters and writes at the database's floor.

Every bulk write goes in slices of :data:`BATCH` rows. New rows and staged moves travel by
``COPY`` on PostgreSQL and one prepared ``executemany`` on SQLite, into the table or a
per-connection temporary table (of :data:`STAGING_META`) that one set-based ``UPDATE ... FROM``
then applies. :func:`dialect_insert` is the dialect's ``INSERT ... ON CONFLICT`` for the rooms and
modules that upsert (the lease, the quota, the deliveries). Nothing here writes an item's state:
that is :func:`~airflow_batch_provider.ledger.transitions.guarded_transition`'s alone.
"""

from __future__ import annotations

import io
import sqlite3
from collections.abc import Iterable, Iterator, Sequence
from datetime import datetime, timezone
from functools import cache
from typing import Any

from sqlalchemy import (
    MetaData,
    Select,
    Table,
    and_,
    bindparam,
    or_,
    text,
    tuple_,
)
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.schema import CreateTable

BATCH = 1000

#: The metadata of the per-connection staging tables (``TEMPORARY``; never created by ``create_all``).
STAGING_META = MetaData()


def chunks(rows: Iterable[Any], size: int = BATCH) -> Iterator[list[Any]]:
    """Yield ``rows`` in lists of at most ``size`` (the last one shorter), streaming.

    :param rows: any rows
    :param size: rows per slice
    """
    buf: list[Any] = []
    for row in rows:
        buf.append(row)
        if len(buf) >= size:
            yield buf
            buf = []
    if buf:
        yield buf


def keyset_pages(
    engine: Engine, query: Select[Any], key: tuple[Any, Any], page: int = BATCH
) -> Iterator[list[Any]]:
    """Run ``query`` a page at a time in ``key`` order, each page its own short read (keyset paging).

    Each page starts after the last key of the one before (``WHERE (key) > (:last) ORDER BY key
    LIMIT page``): the reader holds one page, no cursor stays open between pages (the caller may
    write to the ledger meanwhile), and an index on the filter and the key serves every page.

    :param engine: the ledger's engine
    :param query: the rows, filtered, without an order or a limit; it selects both key columns
    :param key: the two key columns (``item_key``, ``prompt_version``)
    :param page: rows per read
    :return: the pages, each a list of the query's rows
    """
    last: tuple[Any, Any] | None = None
    while True:
        q = query if last is None else query.where(tuple_(*key) > tuple_(*last))
        with engine.connect() as conn:
            rows = list(conn.execute(q.order_by(*key).limit(page)))
        yield rows
        if len(rows) < page:
            return
        last = (rows[-1]._mapping[key[0]], rows[-1]._mapping[key[1]])


def pair_filter(key_col: Any, version_col: Any, pairs: Iterable[tuple[str, str]]) -> Any:
    """An index-friendly filter on (key, version) pairs: ``version = v AND key IN (...)`` per version.

    A row-value ``IN`` of pairs makes PostgreSQL scan the workload; this uses the primary key.

    :param key_col: the key column
    :param version_col: the version column
    :param pairs: the (key, version) pairs
    """
    by_version = keys_by_version(pairs)
    return or_(*(and_(version_col == v, key_col.in_(ks)) for v, ks in by_version.items()))


def keys_by_version(pairs: Iterable[tuple[str, str]]) -> dict[str, list[str]]:
    """(key, version) pairs grouped by version, each group in the pairs' order (:func:`pair_filter`'s shape).

    :param pairs: the (key, version) pairs
    """
    by_version: dict[str, list[str]] = {}
    for key, version in pairs:
        by_version.setdefault(version, []).append(key)
    return by_version


def bulk_update(conn: Connection, table: Any, where: Any, rows: list[dict[str, Any]]) -> None:
    """One ``executemany`` UPDATE per set of columns; ``b_*`` keys address the row.

    :param conn: an open transaction
    :param table: the table
    :param where: the row filter, written with ``b_*`` bind parameters
    :param rows: one dict per row
    """
    groups: dict[tuple[str, ...], list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault(tuple(sorted(k for k in row if not k.startswith("b_"))), []).append(row)
    for columns, group in groups.items():
        conn.execute(table.update().where(where).values({c: bindparam(c) for c in columns}), group)


def stage(
    conn: Connection,
    table: Table,
    rows: Sequence[tuple[Any, ...]],
    columns: Sequence[str] | None = None,
    *,
    analyze: bool = True,
) -> None:
    """Fill a per-connection temporary table with ``rows`` (tuples in column order), emptied first.

    The floor of each database: PostgreSQL gets ``COPY ... FROM STDIN``, SQLite one prepared
    ``executemany`` on the driver's cursor (no per-row SQLAlchemy work). Values must be ``None``,
    ``bool``, ``int`` or ``str``.

    :param conn: an open transaction
    :param table: the staging table (``TEMPORARY``)
    :param rows: the rows
    :param columns: the columns the tuples fill (default: every column, in order); the others stay NULL
    :param analyze: on PostgreSQL, give the planner the staged rows' statistics (a statement that
        joins the staged rows needs them; one that only reads them in order, as an ``INSERT ...
        SELECT`` does, does not)
    """
    if conn.dialect.name == "sqlite":
        # Take the ledger's write lock first (waiting out the busy timeout): a transaction whose
        # first write is to a temporary table reads the ledger before it writes it, and SQLite
        # refuses that write at once if another process committed in between (a stale snapshot).
        conn.execute(text("DELETE FROM abp_meta WHERE 0"))
    conn.execute(CreateTable(table, if_not_exists=True))
    conn.execute(table.delete())
    insert_rows(conn, table, [c.name for c in table.c] if columns is None else columns, rows)
    if analyze and conn.dialect.name == "postgresql":
        # Autovacuum never sees a temporary table: without statistics the planner may pick a
        # hash join that scans the whole items table for a slice of a few thousand rows.
        conn.execute(text(f"ANALYZE {table.name}"))


def insert_rows(
    conn: Connection, table: Table, columns: Sequence[str], rows: Sequence[tuple[Any, ...]]
) -> None:
    """Insert ``rows`` (tuples in ``columns`` order) at the database's floor, in the caller's transaction.

    PostgreSQL: ``COPY ... FROM STDIN`` (text format); SQLite: one prepared ``executemany`` on the
    driver's cursor. Values are ``None``, ``bool``, ``int``, ``str``, or a timestamp as
    :func:`db_stamp` gives it.

    :param conn: an open transaction
    :param table: the table
    :param columns: the columns the tuples fill
    :param rows: the rows
    """
    if not rows:
        return
    names = ", ".join(columns)
    cur = conn.connection.driver_connection.cursor()  # type: ignore[union-attr]
    try:
        if conn.dialect.name == "postgresql":
            buf = io.StringIO()
            buf.writelines("\t".join(map(_copy_text, row)) + "\n" for row in rows)
            buf.seek(0)
            cur.copy_expert(f"COPY {table.name} ({names}) FROM STDIN", buf)
        else:
            marks = ", ".join("?" for _ in columns)
            cur.executemany(f"INSERT INTO {table.name} ({names}) VALUES ({marks})", rows)
    finally:
        cur.close()


def db_stamp(conn: Connection, moment: datetime) -> Any:
    """``moment`` as a bulk insert passes it.

    SQLite gets the DATETIME text of the UTC wall clock (what ``UTCDateTime`` writes), PostgreSQL
    the aware datetime itself.
    """
    utc = moment.astimezone(timezone.utc)
    return utc if conn.dialect.name == "postgresql" else utc.strftime("%Y-%m-%d %H:%M:%S.%f")


_COPY_ESCAPES = str.maketrans({"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"})


def _copy_text(value: Any) -> str:
    """One value in PostgreSQL's COPY text format."""
    if type(value) is str:  # most values: text with nothing to escape (no control character, no backslash)
        return value if value.isprintable() and "\\" not in value else value.translate(_COPY_ESCAPES)
    if value is None:
        return "\\N"
    if value is True:
        return "t"
    if value is False:
        return "f"
    if isinstance(value, int):
        return str(value)
    return str(value).translate(_COPY_ESCAPES)


@cache
def sqlite_json() -> bool:
    """Whether this process's SQLite has the JSON functions (built in since 3.38; an extension before).

    The SQLite ledger's page reads and delivery records go through them where it has them: a
    page as one JSON value, a batch as one ``json_each`` statement (one call into SQLite, the
    interpreter lock released for all of it, not one call and one lock hand-off a row). Without
    them, the same reads and writes go a row at a time.
    """
    probe = sqlite3.connect(":memory:")
    try:
        probe.execute("SELECT json_group_array(json_array(1)), json_extract('[1]', '$[0]')").fetchone()
        probe.execute("SELECT value FROM json_each('[1]')").fetchone()
    except sqlite3.OperationalError:
        return False
    finally:
        probe.close()
    return True


def dialect_insert(conn: Connection) -> Any:
    """The dialect's ``INSERT`` with ``ON CONFLICT`` (SQLite and PostgreSQL)."""
    if conn.dialect.name == "postgresql":
        from sqlalchemy.dialects.postgresql import insert as pg_insert

        return pg_insert
    from sqlalchemy.dialects.sqlite import insert as sqlite_insert

    return sqlite_insert
