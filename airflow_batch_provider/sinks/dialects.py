"""Which statement the SQL sink writes on which database: declared here, once.

The connection's type picks the upsert (:data:`UPSERTS`):

- ``on_conflict`` (PostgreSQL, SQLite): ``INSERT ... ON CONFLICT (keys) DO UPDATE SET col =
  excluded.col``;
- ``on_duplicate_key`` (MySQL, MariaDB): ``INSERT ... ON DUPLICATE KEY UPDATE col = VALUES(col)``.
  ``VALUES(col)`` is what MariaDB reads (it has no ``AS new`` row alias) and what MySQL 8 still
  reads (8.0.20 deprecated it for the alias, with a warning). The row is updated where any unique
  key of the table conflicts, so ``key_columns`` should be its primary key.

Both update the row in place: the columns the sink does not map keep their values, and no row is
deleted, so no delete trigger fires and no ``ON DELETE`` rule reaches another table. MySQL's
``REPLACE``, which the MySQL hook's ``insert_rows(replace=True)`` writes, deletes the row and
inserts it again: every column the sink does not map is lost.

Any other connection type goes through its hook's ``insert_rows(replace=True)``, only where the
statement the hook generates for it is an upsert (SQL Server's ``MERGE``, a dialect's ``ON
CONFLICT``): one that is a ``REPLACE`` (the generic dialect's ``REPLACE INTO``, ``INSERT OR
REPLACE``) is refused before anything is written, naming ``mode="update"``
(:func:`hook_upsert_sql`).

``update`` mode writes ``UPDATE table SET col = ? WHERE key = ?`` on every database. PostgreSQL
writes a batch in one statement (:data:`MULTI_ROW`, :mod:`.pg_batch`); the others send the one-row
statement by ``executemany`` (which mysqlclient turns into one multi-row ``INSERT``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any, Final, Literal

from airflow_batch_provider.exceptions import ConfigurationError

#: The sink's own upsert statements.
Upsert = Literal["on_conflict", "on_duplicate_key"]

#: Connection type -> the upsert the sink writes itself; any other type goes through its hook.
UPSERTS: Final[Mapping[str, Upsert]] = MappingProxyType(
    {
        "postgres": "on_conflict",
        "postgresql": "on_conflict",
        "sqlite": "on_conflict",
        "mysql": "on_duplicate_key",
    }
)
#: The connection types whose batch is written in one statement (:mod:`.pg_batch`).
MULTI_ROW: Final = frozenset({"postgres", "postgresql"})
#: How a hook's statement starts when it deletes the row and inserts it again.
REPLACE_STATEMENTS: Final = ("REPLACE", "INSERT OR REPLACE")


def upsert_of(conn_type: str) -> Upsert | None:
    """The upsert the sink writes itself on a connection of ``conn_type``; ``None``: its hook's.

    :param conn_type: the Airflow connection's type (``postgres``, ``mysql`` ...)
    """
    return UPSERTS.get(conn_type.lower())


def row_statement(
    mode: Literal["upsert", "update"],
    upsert: Upsert,
    table: str,
    keys: Sequence[str],
    columns: Sequence[str],
    placeholder: str,
) -> str:
    """The SQL of one row: parameters in the order values, keys (``update``) or keys, values (``upsert``).

    :param mode: ``upsert`` or ``update``
    :param upsert: the upsert statement (``upsert`` mode)
    :param table: the table
    :param keys: the key columns
    :param columns: the written columns
    :param placeholder: the driver's parameter marker (``%s``, ``?``)
    """
    if mode == "update":
        sets = ", ".join(f"{c} = {placeholder}" for c in columns)
        where = " AND ".join(f"{k} = {placeholder}" for k in keys)
        return f"UPDATE {table} SET {sets} WHERE {where}"
    every = [*keys, *columns]
    insert = f"INSERT INTO {table} ({', '.join(every)}) VALUES ({', '.join([placeholder] * len(every))})"
    if upsert == "on_duplicate_key":
        return f"{insert} ON DUPLICATE KEY UPDATE {', '.join(f'{c} = VALUES({c})' for c in columns)}"
    sets = ", ".join(f"{c} = excluded.{c}" for c in columns)
    return f"{insert} ON CONFLICT ({', '.join(keys)}) DO UPDATE SET {sets}"


def hook_upsert_sql(hook: Any, table: str, fields: Sequence[str], keys: Sequence[str], sink: str) -> str:
    """The statement the hook's ``insert_rows(replace=True)`` writes, if it is an upsert.

    :param hook: the connection's ``DbApiHook``
    :param table: the table
    :param fields: the columns written, keys first
    :param keys: the key columns (the hook's ``replace_index``)
    :param sink: the sink's name, for the message
    :raises ConfigurationError: the hook writes a ``REPLACE`` (delete and insert again), or no
        upsert at all; the message names the sink, the hook, the statement and ``mode="update"``
    """
    try:
        sql = str(
            hook._generate_insert_sql(
                table, [None] * len(fields), list(fields), replace=True, replace_index=list(keys)
            )
        )
    except NotImplementedError as exc:
        raise no_upsert(hook, sink, str(exc)) from exc
    if sql.lstrip().upper().startswith(REPLACE_STATEMENTS):
        raise no_upsert(
            hook,
            sink,
            f"its insert_rows(replace=True) is {sql!r}, which deletes the row and inserts it again: the "
            "columns the sink does not map would be lost, delete triggers and ON DELETE rules would fire",
        )
    return sql


def no_upsert(hook: Any, sink: str, why: str) -> ConfigurationError:
    """The error of a sink in ``upsert`` mode whose hook writes no upsert.

    :param hook: the connection's hook
    :param sink: the sink's name
    :param why: what the hook writes instead
    """
    return ConfigurationError(
        f"sink {sink!r}: the {type(hook).__name__} writes no upsert ({why}); use mode='update' (update "
        f"by key), or a connection type whose upsert the sink writes itself ({', '.join(sorted(UPSERTS))})."
    )
