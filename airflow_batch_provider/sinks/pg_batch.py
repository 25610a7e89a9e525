"""PostgreSQL: a sink's batch written by one multi-row statement instead of one statement per row.

``executemany`` of the one-row ``INSERT ... ON CONFLICT`` (or ``UPDATE``) costs the database one
statement per row; here a batch is one statement (or a few, under PostgreSQL's 65,535 parameters):

- ``upsert``: ``INSERT INTO t (keys, cols) VALUES (...), (...) ON CONFLICT (keys) DO UPDATE SET
  col = excluded.col``;
- ``update``: ``UPDATE t SET col = v.col FROM (VALUES (...), (...)) AS v (keys, cols) WHERE
  t.key = v.key``, each value cast to its column's type (read from the catalog once), as a
  one-row ``UPDATE`` would assign it.

The guarantees are the one-row writer's (:mod:`airflow_batch_provider.sinks.sql`): one
transaction per batch; the same values onto the same rows when a batch is written again; a key
given twice in a batch ends with the later row's values (what one statement per row in order
leaves); a batch the database refuses with a type or constraint error is rolled back and written
again row by row, so the refused rows are reported with the database's message and the others
are written. A callable column mapping (each row names its columns) goes row by row as before.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

from airflow_batch_provider.services.delivery import SinkRow
from airflow_batch_provider.sinks.db_batch import write_batch

if TYPE_CHECKING:
    from airflow_batch_provider.sinks.sql import SqlUpsertSink, _DbApiWriter

#: PostgreSQL's limit of bound parameters in one statement.
MAX_PARAMETERS: Final = 65_535

COLUMN_TYPES: Final = (
    "SELECT a.attname, format_type(a.atttypid, a.atttypmod) FROM pg_attribute a "
    "WHERE a.attrelid = CAST(%s AS regclass) AND a.attnum > 0 AND NOT a.attisdropped"
)


def column_types(conn: Any, table: str) -> dict[str, str]:
    """The declared type of each column of ``table`` (``format_type``: ``integer``, ``vector(4)``).

    Read inside the first batch's transaction (before its first write), so nothing is committed here.

    :param conn: an open DB-API connection to PostgreSQL
    :param table: the table (``schema.table`` allowed)
    """
    cursor = conn.cursor()
    try:
        cursor.execute(COLUMN_TYPES, (table,))
        found = {str(name): str(kind) for name, kind in cursor.fetchall()}
    finally:
        cursor.close()
    return found


def last_per_key(sink: SqlUpsertSink, rows: Sequence[SinkRow]) -> list[SinkRow]:
    """The rows with each key once: its last row (as statements run in order would leave it).

    :param sink: the sink (its key columns)
    :param rows: the batch
    """
    kept: dict[tuple[Any, ...], SinkRow] = {}
    for row in rows:
        key = tuple(row.keys[k] for k in sink.key_columns)
        kept.pop(key, None)
        kept[key] = row
    return list(kept.values())


@dataclass
class PgBatchWriter:
    """A batch in one statement per at most 65,535 parameters; a refused batch goes row by row.

    :param sink: the sink
    :param conn: the DB-API connection (psycopg 3 or psycopg2: ``%s`` markers)
    :param rows_writer: the one-row writer a refused batch (or a callable mapping) falls back to
    """

    sink: SqlUpsertSink
    conn: Any
    rows_writer: _DbApiWriter
    _types: dict[str, str] | None = field(default=None, init=False, repr=False)

    def write(self, rows: Sequence[SinkRow]) -> dict[int, str]:
        """Write ``rows`` in one transaction; return the refused rows (index -> the database's message).

        :param rows: the batch
        """
        if not self.sink.column_names():
            return self.rows_writer.write(rows)
        unique = last_per_key(self.sink, rows)
        width = len(self.sink.key_columns) + len(self.sink.column_names())
        per_statement = max(1, MAX_PARAMETERS // width)

        def run(cursor: Any) -> None:
            for start in range(0, len(unique), per_statement):
                part = unique[start : start + per_statement]
                params = [value for row in part for value in self.sink.params(row)]
                cursor.execute(self.statement(len(part)), params)

        if write_batch(self.conn, run):
            return {}
        return self.rows_writer.one_by_one(rows)

    def statement(self, count: int) -> str:
        """The statement of ``count`` rows (parameters in :meth:`SqlUpsertSink.params` order, row after row).

        :param count: rows in the statement
        """
        keys = list(self.sink.key_columns)
        cols = self.sink.column_names()
        table = self.sink.table
        if self.sink.mode == "upsert":
            one = "(" + ", ".join(["%s"] * (len(keys) + len(cols))) + ")"
            sets = ", ".join(f"{c} = excluded.{c}" for c in cols)
            return (
                f"INSERT INTO {table} ({', '.join([*keys, *cols])}) VALUES {', '.join([one] * count)} "
                f"ON CONFLICT ({', '.join(keys)}) DO UPDATE SET {sets}"
            )
        order = [*cols, *keys]  # the update's parameter order
        types = self.types()
        one = "(" + ", ".join(f"CAST(%s AS {types[c]})" if c in types else "%s" for c in order) + ")"
        sets = ", ".join(f"{c} = abp_v.{c}" for c in cols)
        where = " AND ".join(f"{table}.{k} = abp_v.{k}" for k in keys)
        return (
            f"UPDATE {table} SET {sets} FROM (VALUES {', '.join([one] * count)}) "
            f"AS abp_v ({', '.join(order)}) WHERE {where}"
        )

    def types(self) -> dict[str, str]:
        """The target columns' types, read from the catalog on first use."""
        if self._types is None:
            self._types = column_types(self.conn, self.sink.table)
        return self._types
