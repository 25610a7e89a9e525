"""What counts as the database refusing a row, and a batch committed or rolled back whole (real SQLite)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

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
