"""PostgreSQL: a sink's batch written by one set-based statement, not a statement per row.

``executemany`` of the one-row ``INSERT ... ON CONFLICT`` (or ``UPDATE``) costs the database one
statement per row. Here a batch is one statement over all its rows, each value cast to its target
column's type (the types read from the catalog once):

- ``upsert``: ``INSERT INTO t (keys, cols) SELECT ... ON CONFLICT (keys) DO UPDATE SET col =
  excluded.col``;
- ``update``: ``UPDATE t SET col = v.col FROM (SELECT ...) AS v WHERE t.key = v.key``.

The rows travel in one of three ways:

- **one JSON array** (either driver), when every value is a ``str``, ``int``, finite ``float``,
  ``bool`` or ``None`` (what JSON answers map to): one bound parameter, read by
  ``json_array_elements``, each value's text (``->>``: a number's digits as written, a string
  unescaped) cast to its column's type, as ``COPY`` reads a value's text. One call into the driver
  a batch, not one a row (the delivery's other threads are not kept waiting for the interpreter
  lock a thousand times a batch), no staging table to fill and empty: measured alone, a quarter
  less CPU in this process and a tenth less in the server than ``COPY``;
- **``COPY``** on psycopg 3 (the driver of the Airflow ``postgres`` hook) for any other batch
  (a callable's ``Decimal``, ``datetime``, ``bytes``; a ``str`` or ``int`` subclass such as an
  ``Enum``, which psycopg adapts in its own way; a NaN or an infinity; a batch whose JSON would
  pass :data:`JSON_LIMIT`): copied (``COPY ... FROM STDIN``) into a temporary table of the
  target columns' types (emptied at every commit), then written by one statement from it, each
  value adapted by psycopg as before;
- on psycopg2, one multi-row statement (or a few, under PostgreSQL's 65,535 parameters):
  ``INSERT ... VALUES (...), (...) ON CONFLICT``, or ``UPDATE ... FROM (VALUES ...)`` with each
  value cast to its column's type.

Each value is parsed by the server as its column's type (a value that does not parse is the
database refusing its row, as a type error of the one-row statement is): cast to the column's base
type without a length (:data:`COLUMN_TYPES`), then assigned to the column, so a value too long for
a ``varchar(n)`` is refused as the one-row statement refuses it, never cut to fit. In a JSON array
a ``bool`` reaches a text column as ``true``/``false``, as the one-row statement writes it
(``COPY`` writes ``t``/``f``).

The guarantees are the one-row writer's (:mod:`airflow_batch_provider.sinks.sql`): one
transaction per batch; the same values onto the same rows when a batch is written again; a key
given twice in a batch ends with the later row's values (what one statement per row in order
leaves); a batch the database refuses with a type or constraint error is rolled back and written
again row by row, so the refused rows are reported with the database's message and the others
are written. A callable column mapping (each row names its columns) goes row by row as before.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from itertools import chain
from typing import TYPE_CHECKING, Any, Final

from airflow_batch_provider.ledger.digests import json_writer
from airflow_batch_provider.services.delivery import SinkRow
from airflow_batch_provider.sinks.db_batch import write_batch

if TYPE_CHECKING:
    from airflow_batch_provider.sinks.sql import SqlUpsertSink, _DbApiWriter

#: PostgreSQL's limit of bound parameters in one statement.
MAX_PARAMETERS: Final = 65_535
#: The exact types of the values a batch may carry as one JSON array (a subclass, an ``Enum``
#: say, is adapted by psycopg in its own way: it goes by ``COPY``).
JSON_TYPES: Final = frozenset({str, int, float, bool, type(None)})
#: A batch whose JSON array is longer than this (characters) goes by ``COPY``, which streams it
#: (one bound value is at most a gigabyte in PostgreSQL).
JSON_LIMIT: Final = 64 * 1024 * 1024
#: A batch's rows as one compact JSON array of arrays; a NaN or an infinity raises ``ValueError``.
_batch_json: Final = json_writer(",", ":", sort_keys=False, finite=True)


def batch_json(params: Sequence[tuple[Any, ...]]) -> str | None:
    """The rows' parameters as one JSON array of arrays, or ``None`` where they cannot travel so.

    ``None`` for a value of another type than :data:`JSON_TYPES`, a NaN or an infinity (JSON has
    none), or an array longer than :data:`JSON_LIMIT`.

    :param params: each row's parameters
    """
    if not JSON_TYPES.issuperset(map(type, chain.from_iterable(params))):
        return None
    try:
        text = _batch_json(params)
    except ValueError:  # a NaN or an infinity
        return None
    return text if len(text) <= JSON_LIMIT else None


#: Each column's declared type, and the type a value is cast to on its way in: the column's base
#: type (a domain's, to the last one) by its own name, without a length or precision. An explicit
#: ``CAST`` to ``varchar(3)``, ``char(2)``, ``bit(3)`` or a domain over one cuts a longer value to
#: fit without a word; cast to the bare type, the value then meets the column's length, precision
#: and constraints as the ``INSERT`` or ``UPDATE`` assigns it, and one too long is refused.
COLUMN_TYPES: Final = (
    "WITH RECURSIVE base (attname, declared, oid) AS ("
    " SELECT a.attname, format_type(a.atttypid, a.atttypmod), a.atttypid FROM pg_attribute a"
    " WHERE a.attrelid = CAST(%s AS regclass) AND a.attnum > 0 AND NOT a.attisdropped"
    " UNION ALL SELECT b.attname, b.declared, t.typbasetype FROM base b"
    " JOIN pg_type t ON t.oid = b.oid WHERE t.typtype = 'd')"
    " SELECT b.attname, b.declared, quote_ident(n.nspname) || '.' || quote_ident(t.typname)"
    " FROM base b JOIN pg_type t ON t.oid = b.oid JOIN pg_namespace n ON n.oid = t.typnamespace"
    " WHERE t.typtype <> 'd'"
)


@dataclass(frozen=True)
class ColumnTypes:
    """A table's column types, as :data:`COLUMN_TYPES` reads them.

    :param declared: column -> its declared type (``format_type``: ``integer``, ``vector(4)``)
    :param cast: column -> the type a value is cast to (``pg_catalog."varchar"``: no length)
    """

    declared: dict[str, str]
    cast: dict[str, str]


def column_types(conn: Any, table: str) -> ColumnTypes:
    """The declared type of each column of ``table``, and the bare type its values are cast to.

    Read inside the first batch's transaction (before its first write), so nothing is committed here.

    :param conn: an open DB-API connection to PostgreSQL
    :param table: the table (``schema.table`` allowed)
    """
    cursor = conn.cursor()
    try:
        cursor.execute(COLUMN_TYPES, (table,))
        found = cursor.fetchall()
    finally:
        cursor.close()
    return ColumnTypes(
        {str(name): str(declared) for name, declared, _ in found},
        {str(name): str(cast) for name, _, cast in found},
    )


def last_per_key(sink: SqlUpsertSink, params: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """The rows' parameters with each key once: its last row's (as statements run in order would leave it).

    :param sink: the sink (its key columns and mode, which place the key in the parameters)
    :param params: each row's parameters, in :meth:`SqlUpsertSink.params` order
    """
    width = len(sink.key_columns)
    key = slice(0, width) if sink.mode == "upsert" else slice(-width, None)
    kept = {one[key]: one for one in params}
    return params if len(kept) == len(params) else list(kept.values())


@dataclass
class PgBatchWriter:
    """A batch in one statement (:func:`batch_json`, else ``COPY`` or multi-row statements); a refused batch goes row by row.

    :param sink: the sink
    :param conn: the DB-API connection (psycopg 3 or psycopg2: ``%s`` markers)
    :param rows_writer: the one-row writer a refused batch (or a callable mapping) falls back to
    """

    sink: SqlUpsertSink
    conn: Any
    rows_writer: _DbApiWriter
    _types: ColumnTypes | None = field(default=None, init=False, repr=False)
    #: whether this session holds the staging table (a rolled-back batch that made it takes it away)
    _staged: bool = field(default=False, init=False, repr=False)

    def write(self, rows: Sequence[SinkRow]) -> dict[int, str]:
        """Write ``rows`` in one transaction; return the refused rows (index -> the database's message).

        :param rows: the batch
        """
        if not self.sink.column_names():
            return self.rows_writer.write(rows)
        params = last_per_key(self.sink, [self.sink.params(row) for row in rows])
        as_json = batch_json(params)

        def run(cursor: Any) -> None:
            if as_json is not None:  # the common batch: its rows as one bound JSON array
                cursor.execute(self._json_statement, (as_json,))
            elif hasattr(cursor, "copy"):  # psycopg 3
                self.copy(cursor, params)
            else:
                self.values(cursor, params)

        try:
            if write_batch(self.conn, run):
                return {}
        except Exception:
            self._staged = False  # rolled back: a staging table made by this batch is gone
            raise
        self._staged = False
        return self.rows_writer.one_by_one(rows)

    def copy(self, cursor: Any, params: Sequence[tuple[Any, ...]]) -> None:
        """Copy the rows into the staging table and write them with one statement (psycopg 3).

        :param cursor: a psycopg 3 cursor, in the batch's transaction
        :param params: each row's values in :meth:`SqlUpsertSink.params` order
        """
        create, copy_in, write = self._copy_statements
        # emptied at every commit; made once per session (a round trip less per batch): a rolled-back
        # batch takes it away with it, and the next batch makes it again
        if not self._staged:
            cursor.execute(create)
            self._staged = True
        with cursor.copy(copy_in) as copy:
            for one in params:
                copy.write_row(one)
        cursor.execute(write)

    def values(self, cursor: Any, params: Sequence[tuple[Any, ...]]) -> None:
        """Write the rows as multi-row statements of at most 65,535 parameters each (psycopg2).

        :param cursor: a cursor, in the batch's transaction
        :param params: each row's values in :meth:`SqlUpsertSink.params` order
        """
        per_statement = max(1, MAX_PARAMETERS // len(self.order()))
        for start in range(0, len(params), per_statement):
            part = params[start : start + per_statement]
            cursor.execute(self.statement(len(part)), [value for one in part for value in one])

    @cached_property
    def _json_statement(self) -> str:
        """The batch's statement from one JSON array of rows (:func:`batch_json`), bound as ``%s``."""
        cast = self.types().cast
        values = ", ".join(
            f"CAST(abp_r ->> {i} AS {cast.get(c, 'text')})" for i, c in enumerate(self.order())
        )
        return self._written_from(f"SELECT {values} FROM json_array_elements(CAST(%s AS json)) AS abp_r")

    @cached_property
    def _copy_statements(self) -> tuple[str, str, str]:
        """The staging table's ``CREATE``, its ``COPY`` and the write from it (made on the first batch)."""
        order = self.order()
        types = self.types().declared
        stage = "abp_stage_" + hashlib.sha256(repr((self.sink.table, order, types)).encode()).hexdigest()[:16]
        columns = ", ".join(order)
        declared = ", ".join(f"{c} {types.get(c, 'text')}" for c in order)
        create = f"CREATE TEMPORARY TABLE IF NOT EXISTS {stage} ({declared}) ON COMMIT DELETE ROWS"
        copy_in = f"COPY pg_temp.{stage} ({columns}) FROM STDIN"
        return create, copy_in, self._written_from(f"SELECT {columns} FROM pg_temp.{stage}")

    def _written_from(self, rows: str) -> str:
        """The batch's one statement, its rows (columns in :meth:`order`) read by the query ``rows``.

        :param rows: a ``SELECT`` or ``VALUES`` of the batch's rows
        """
        columns = ", ".join(self.order())
        keys, cols, table = list(self.sink.key_columns), self.sink.column_names(), self.sink.table
        if self.sink.mode == "upsert":
            sets = ", ".join(f"{c} = excluded.{c}" for c in cols)
            return (
                f"INSERT INTO {table} ({columns}) {rows} ON CONFLICT ({', '.join(keys)}) DO UPDATE SET {sets}"
            )
        sets = ", ".join(f"{c} = abp_v.{c}" for c in cols)
        where = " AND ".join(f"{table}.{k} = abp_v.{k}" for k in keys)
        return f"UPDATE {table} SET {sets} FROM ({rows}) AS abp_v ({columns}) WHERE {where}"

    def order(self) -> list[str]:
        """The columns in :meth:`SqlUpsertSink.params` order (keys first for an upsert, last for an update)."""
        keys, cols = list(self.sink.key_columns), self.sink.column_names()
        return [*keys, *cols] if self.sink.mode == "upsert" else [*cols, *keys]

    def statement(self, count: int) -> str:
        """The statement of ``count`` rows (parameters in :meth:`SqlUpsertSink.params` order, row after row).

        :param count: rows in the statement
        """
        if self.sink.mode == "upsert":
            one = "(" + ", ".join(["%s"] * len(self.order())) + ")"
        else:
            cast = self.types().cast
            one = "(" + ", ".join(f"CAST(%s AS {cast[c]})" if c in cast else "%s" for c in self.order()) + ")"
        return self._written_from(f"VALUES {', '.join([one] * count)}")

    def types(self) -> ColumnTypes:
        """The target columns' types, read from the catalog on first use."""
        if self._types is None:
            self._types = column_types(self.conn, self.sink.table)
        return self._types
