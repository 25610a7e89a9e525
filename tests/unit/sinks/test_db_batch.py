"""What counts as the database refusing a row, and a batch committed or rolled back whole (real SQLite, real MariaDB)."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest

from airflow_batch_provider.sinks.db_batch import refused_by_database, write_batch


def test_a_constraint_or_type_error_is_a_refusal_and_a_failing_database_is_not() -> None:
    assert refused_by_database(sqlite3.IntegrityError("UNIQUE constraint failed"))
    assert refused_by_database(sqlite3.DataError("bad value"))
    assert not refused_by_database(sqlite3.OperationalError("database is locked"))


def test_a_refused_batch_is_rolled_back_whole_and_another_error_is_raised(tmp_path: Path) -> None:
    conn = sqlite3.connect(tmp_path / "t.sqlite")
    conn.execute("CREATE TABLE t (k INTEGER PRIMARY KEY, v TEXT NOT NULL)")
    conn.commit()
    assert write_batch(conn, lambda cur: cur.executemany("INSERT INTO t VALUES (?, ?)", [(1, "a"), (2, "b")]))
    refused = write_batch(
        conn, lambda cur: cur.executemany("INSERT INTO t VALUES (?, ?)", [(3, "c"), (1, "x")])
    )
    assert refused is False
    assert conn.execute("SELECT k, v FROM t ORDER BY k").fetchall() == [(1, "a"), (2, "b")]
    with pytest.raises(sqlite3.OperationalError):
        write_batch(conn, lambda cur: cur.execute("INSERT INTO missing VALUES (1)"))
    conn.close()


def test_mysql_refusing_a_value_or_a_check_is_a_refusal_and_an_unknown_column_or_a_lost_connection_is_not(
    mysql_server: Any,
) -> None:
    import MySQLdb

    name = mysql_server.create_database()
    mysql_server.execute(
        "CREATE TABLE t (k INT PRIMARY KEY, n INT, d DATE, CONSTRAINT positive CHECK (n > 0))", name
    )
    conn = MySQLdb.connect(host=mysql_server.host, port=mysql_server.port, user="root", database=name)

    def raised(sql: str) -> Any:
        try:
            conn.cursor().execute(sql)
        except MySQLdb.Error as exc:
            return exc
        raise AssertionError(f"{sql!r} raised nothing")

    refused = [
        raised("INSERT INTO t VALUES (1, 'many', NULL)"),
        raised("INSERT INTO t VALUES (1, 1, 'someday')"),
        raised("INSERT INTO t VALUES (1, -1, NULL)"),
        raised("INSERT INTO t VALUES (NULL, 1, NULL)"),
    ]
    assert [(e.args[0], type(e).__name__, refused_by_database(e)) for e in refused] == [
        (1366, "OperationalError", True),  # not of the column's type
        (1292, "OperationalError", True),  # not a date
        (4025, "OperationalError", True),  # MariaDB's CHECK
        (1048, "IntegrityError", True),
    ]
    assert write_batch(conn, lambda cur: cur.execute("INSERT INTO t VALUES (1, 'many', NULL)")) is False
    with pytest.raises(MySQLdb.OperationalError, match="Unknown column 'nope'"):
        write_batch(conn, lambda cur: cur.execute("INSERT INTO t (k, nope) VALUES (1, 1)"))
    failed = [
        raised("INSERT INTO t (k, nope) VALUES (1, 1)"),
        raised("KILL CONNECTION_ID()"),
        raised("SELECT 1"),
    ]
    assert [(e.args[0], type(e).__name__, refused_by_database(e)) for e in failed[:2]] == [
        (1054, "OperationalError", False),
        (1927, "OperationalError", False),  # the connection killed
    ]
    # then gone: "server has gone away" (2006) or "lost connection" (2013), as the client notices
    assert failed[2].args[0] in (2006, 2013) and not refused_by_database(failed[2])
    conn.close()
    mysql_server.drop_database(name)
