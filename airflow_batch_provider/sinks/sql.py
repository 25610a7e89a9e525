"""``SqlUpsertSink``: a workload's final answers written into the user's table, once per item.

Through whatever ``common.sql`` hook the connection's type names (``DbApiHook``). Two modes:

- ``upsert``: insert the row, or update it in place when its key is there: PostgreSQL and SQLite
  get ``INSERT ... ON CONFLICT (keys) DO UPDATE``, MySQL and MariaDB ``INSERT ... ON DUPLICATE KEY
  UPDATE``; other databases go through the hook's ``insert_rows(replace=True)`` where that is an
  upsert (``MERGE``), and a hook that writes a ``REPLACE`` (delete, then insert) is refused with a
  message naming ``mode="update"`` (which statement on which database: :mod:`.dialects`).
- ``update``: ``UPDATE table SET ... WHERE keys = ...``, to write the label back onto the source
  row; a key with no row there writes nothing.

Each batch is one transaction. Both modes are idempotent (the same values onto the same row),
which is what makes a crash between the sink's commit and the ledger's harmless (see
:mod:`airflow_batch_provider.services.delivery`). A batch the database refuses with a type or
constraint error (DB-API ``DataError`` or ``IntegrityError``) is rolled back and written again row
by row: the refused rows are reported with the database's message, the others are written. Any
other database error (a lost connection, a missing column) fails the task.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Literal

from airflow_batch_provider.core.json_path import parse_path
from airflow_batch_provider.core.lineage import DatasetRef
from airflow_batch_provider.exceptions import ConfigurationError
from airflow_batch_provider.ledger.candidates import Candidate
from airflow_batch_provider.services.delivery import RowWriter, SinkRow
from airflow_batch_provider.sinks.db_batch import refused_by_database, write_batch
from airflow_batch_provider.sinks.dialects import (
    MULTI_ROW,
    Upsert,
    hook_upsert_sql,
    no_upsert,
    row_statement,
    upsert_of,
)
from airflow_batch_provider.sinks.row_map import IDENTIFIER, Column, RowMap, bindable, compile_row_map

#: A column's value: a JSON path into the answer (``"$.label"``) or a callable of the result.
ColumnSource = str | Callable[[Candidate], Any]


def _ident(what: str, name: str) -> str:
    if not IDENTIFIER.match(name):
        raise ConfigurationError(
            f"SqlUpsertSink {what}={name!r} is not a plain SQL identifier; use letters, digits and '_' "
            "(and one '.' for a schema), e.g. 'public.tickets'."
        )
    return name


@dataclass(frozen=True)
class SqlUpsertSink:
    """Write each item's final answer into a table through an Airflow SQL connection.

    :param conn_id: the connection (its type names the hook: ``postgres``, ``sqlite``, ...)
    :param table: the target table (``schema.table`` allowed)
    :param key_columns: the key: the first column gets the application id, a second (where the
        table keeps versions) the prompt version
    :param columns: column -> JSON path into the answer (``"$.label"``, ``"$"`` for the whole
        answer as JSON) or a callable of the result; or one callable returning column -> value
    :param mode: ``upsert`` (insert or update by key) or ``update`` (update the row with that key)
    :param name: the name deliveries are recorded under and the task is named after
        (``deliver_<name>``); default: the table name
    :param batch_size: rows per transaction
    :param key_type: converts the application id for the key column (e.g. ``int``)
    """

    conn_id: str
    table: str
    key_columns: Sequence[str]
    columns: Mapping[str, ColumnSource] | Callable[[Candidate], Mapping[str, Any]]
    mode: Literal["upsert", "update"] = "upsert"
    name: str | None = None
    batch_size: int = 1000
    key_type: Callable[[str], Any] = str
    #: the mapping compiled into its two functions (``None`` for a callable mapping)
    _map: RowMap | None = field(default=None, init=False, repr=False, compare=False)
    #: the mapped columns' names, in the mapping's order (empty for a callable mapping)
    _names: tuple[str, ...] = field(default=(), init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        _ident("table", self.table)
        keys = tuple(self.key_columns)
        if not 1 <= len(keys) <= 2:
            raise ConfigurationError(
                f"SqlUpsertSink key_columns={keys!r}; give one column (the application id) or two "
                "(the application id, then the prompt version)."
            )
        for key in keys:
            _ident("key column", key)
        object.__setattr__(self, "key_columns", keys)
        if self.mode not in ("upsert", "update"):
            raise ConfigurationError(f"SqlUpsertSink mode={self.mode!r}; use 'upsert' or 'update'.")
        if self.batch_size < 1:
            raise ConfigurationError(f"SqlUpsertSink batch_size={self.batch_size}; use 1 or more.")
        if isinstance(self.columns, Mapping):
            object.__setattr__(self, "_names", tuple(self.columns))
            if not self.columns:
                raise ConfigurationError("SqlUpsertSink columns is empty; map at least one column.")
            plan: list[Column] = []
            for column, source in self.columns.items():
                _ident("column", column)
                if column in keys:
                    raise ConfigurationError(f"SqlUpsertSink column {column!r} is a key column; map it once.")
                if isinstance(source, str):
                    plan.append((column, parse_path(source), None))
                elif callable(source):
                    plan.append((column, (), source))
                else:
                    raise ConfigurationError(
                        f"SqlUpsertSink column {column!r}: {source!r}; give a JSON path ('$.label') or a callable."
                    )
            object.__setattr__(
                self, "_map", compile_row_map(keys, self.key_type, plan, keys_last=self.mode == "update")
            )
        elif not callable(self.columns):
            raise ConfigurationError(
                "SqlUpsertSink columns: give a mapping of column -> source, or a callable."
            )
        if self.name is not None and not re.match(r"^[A-Za-z0-9_]{1,64}$", self.name):
            raise ConfigurationError(
                f"SqlUpsertSink name={self.name!r}; use letters, digits and '_' (it names a task)."
            )

    @property
    def sink_name(self) -> str:
        """The name deliveries are recorded under (``name``, else the table's name)."""
        return self.name or self.table.replace(".", "_")

    @property
    def dataset(self) -> DatasetRef:
        """What it writes, for lineage: the table."""
        return DatasetRef("table", self.table, self.conn_id)

    def row_for(self, result: Candidate) -> SinkRow:
        """Map one final answer to its row.

        :param result: the answer
        """
        if self._map is not None:  # a mapping of columns: compiled once (:mod:`.row_map`)
            return self._map.row_for(result)
        keys: dict[str, Any] = {self.key_columns[0]: self.key_type(result.app_id)}
        if len(self.key_columns) == 2:
            keys[self.key_columns[1]] = result.prompt_version
        values = {k: bindable(v) for k, v in dict(self.columns(result)).items()}  # type: ignore[operator]
        for column in values:
            _ident("column", column)
        return SinkRow(keys, values)

    @contextmanager
    def open(self) -> Iterator[RowWriter]:
        """Open the connection's hook for one delivery (one DB-API connection for all batches)."""
        from airflow_batch_provider.hooks.sql import sql_connection_hook

        hook, conn_type = sql_connection_hook(self.conn_id, "a SqlUpsertSink")
        upsert = upsert_of(conn_type)
        if self.mode == "upsert" and upsert is None:
            yield _HookWriter(self, hook)
            return
        dbapi = hook.get_conn()
        try:
            rows_writer = self.writer(dbapi, hook.placeholder, upsert or "on_conflict")
            if conn_type.lower() in MULTI_ROW:  # a batch in one multi-row statement
                from airflow_batch_provider.sinks.pg_batch import PgBatchWriter

                yield PgBatchWriter(self, dbapi, rows_writer)
            else:
                yield rows_writer
        finally:
            dbapi.close()

    def writer(self, dbapi: Any, placeholder: str, upsert: Upsert = "on_conflict") -> _DbApiWriter:
        """The writer of this sink's statement on an open DB-API connection (the caller closes it).

        ``executemany`` of :meth:`statement`, one commit per batch; a batch the database refuses
        goes again row by row to find the refused rows.

        :param dbapi: the DB-API connection
        :param placeholder: the driver's placeholder (``%s``, ``?``)
        :param upsert: the database's upsert statement (:mod:`.dialects`)
        """
        return _DbApiWriter(self, dbapi, self.statement(placeholder, upsert), placeholder, upsert)

    def statement(
        self, placeholder: str, upsert: Upsert = "on_conflict", columns: Sequence[str] | None = None
    ) -> str:
        """The SQL of one row (the database's upsert, or ``UPDATE``), for ``executemany``.

        :param placeholder: the driver's placeholder (``%s``, ``?``)
        :param upsert: the database's upsert statement (:mod:`.dialects`)
        :param columns: the written columns (default: the mapping's)
        """
        written = self.column_names() if columns is None else list(columns)
        return row_statement(self.mode, upsert, self.table, self.key_columns, written, placeholder)

    def column_names(self) -> list[str]:
        """The written columns when they are known up front (a mapping), else ``[]``."""
        return list(self._names)

    def params(self, row: SinkRow) -> tuple[Any, ...]:
        """One row's parameters in :meth:`statement`'s order.

        :param row: the row
        """
        if self._map is not None:
            return self._map.params(row)
        values = tuple(row.values.values())  # a callable mapping: the row names its columns
        keys = tuple(map(row.keys.__getitem__, self.key_columns))
        return values + keys if self.mode == "update" else keys + values


@dataclass
class _DbApiWriter:
    """``executemany`` of one statement, one commit per batch; a refused batch goes row by row."""

    sink: SqlUpsertSink
    conn: Any
    sql: str
    placeholder: str = "%s"
    upsert: Upsert = "on_conflict"

    def write(self, rows: Sequence[SinkRow]) -> dict[int, str]:
        if not self.sink.column_names():  # a callable mapping: every row names its own columns
            return self.one_by_one(rows)
        params = [self.sink.params(row) for row in rows]
        if write_batch(self.conn, lambda cursor: cursor.executemany(self.sql, params)):
            return {}
        return self.one_by_one(rows)

    def one_by_one(self, rows: Sequence[SinkRow]) -> dict[int, str]:
        """Write ``rows`` one statement and one commit each; return the refused ones (index -> message).

        :param rows: the batch
        """
        refused: dict[int, str] = {}
        cursor = self.conn.cursor()
        try:
            for index, row in enumerate(rows):
                sql = self.sql
                if not self.sink.column_names():  # the row names its columns
                    sql = self.sink.statement(self.placeholder, self.upsert, list(row.values))
                try:
                    cursor.execute(sql, self.sink.params(row))
                    self.conn.commit()
                except Exception as exc:
                    self.conn.rollback()
                    if not refused_by_database(exc):
                        raise
                    refused[index] = f"{type(exc).__name__}: {str(exc).strip()}"
        finally:
            cursor.close()
        return refused


@dataclass
class _HookWriter:
    """Other databases: the hook's ``insert_rows(replace=True)``, where that is an upsert (``MERGE``)."""

    sink: SqlUpsertSink
    hook: Any

    def write(self, rows: Sequence[SinkRow]) -> dict[int, str]:
        fields = self._fields(rows)
        hook_upsert_sql(self.hook, self.sink.table, fields, self.sink.key_columns, self.sink.sink_name)
        try:
            self._insert(rows)
            return {}
        except NotImplementedError as exc:
            raise no_upsert(self.hook, self.sink.sink_name, str(exc)) from exc
        except Exception as exc:
            if not refused_by_database(exc):
                raise
        refused: dict[int, str] = {}
        for index, row in enumerate(rows):
            try:
                self._insert([row])
            except Exception as exc:
                if not refused_by_database(exc):
                    raise
                refused[index] = f"{type(exc).__name__}: {str(exc).strip()}"
        return refused

    def _fields(self, rows: Sequence[SinkRow]) -> list[str]:
        return [*self.sink.key_columns, *(self.sink.column_names() or list(rows[0].values))]

    def _insert(self, rows: Sequence[SinkRow]) -> None:
        fields = self._fields(rows)
        values = [tuple({**row.keys, **row.values}.get(f) for f in fields) for row in rows]
        self.hook.insert_rows(
            self.sink.table,
            values,
            target_fields=fields,
            # the batch in one transaction: commit_every=0 says so, but a hook that supports
            # executemany (PostgreSQL's, SQL Server's) then inserts nothing (chunks of 0 rows)
            commit_every=len(rows),
            replace=True,
            replace_index=list(self.sink.key_columns),
        )
