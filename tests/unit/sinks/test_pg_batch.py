"""A PostgreSQL sink's batch in one statement (COPY then INSERT ... SELECT on psycopg 3, multi-row on psycopg2), against a real PostgreSQL."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from pathlib import Path

import pytest

from airflow_batch_provider.services.delivery import SinkRow
from airflow_batch_provider.sinks.pg_batch import PgBatchWriter
from airflow_batch_provider.sinks.sql import SqlUpsertSink
from tests.unit.sinks.target import CONN_ID, Target, target_for

pytestmark = pytest.mark.postgres
TABLE = (
    "CREATE TABLE scores (ticket_id INTEGER PRIMARY KEY, label TEXT CHECK (label <> 'bad'),"
    " confidence DOUBLE PRECISION, due DATE, meta JSONB)"
)


@pytest.fixture
def target(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, postgres_server: object) -> Iterator[Target]:
    with target_for("postgresql", tmp_path, postgres_server) as found:
        monkeypatch.setenv(f"AIRFLOW_CONN_{CONN_ID.upper()}", found.conn_json)
        found.execute(TABLE)
        yield found


def sink(mode: str) -> SqlUpsertSink:
    return SqlUpsertSink(
        conn_id=CONN_ID,
        table="scores",
        key_columns=["ticket_id"],
        columns={"label": "$.label", "confidence": "$.confidence", "due": "$.due", "meta": "$.meta"},
        mode=mode,  # type: ignore[arg-type]
    )


def row(key: int, label: str, confidence: float = 0.5) -> SinkRow:
    return SinkRow(
        {"ticket_id": key},
        {"label": label, "confidence": confidence, "due": "2026-12-01", "meta": '{"n": 1}'},
    )


def test_a_postgresql_upsert_batch_is_written_by_the_batch_writer_and_a_key_given_twice_ends_with_its_later_values(
    target: Target,
) -> None:
    with sink("upsert").open() as writer:
        assert isinstance(writer, PgBatchWriter)
        assert writer.write([row(1, "a"), row(2, "b"), row(1, "c", 0.9)]) == {}
        assert writer.write([row(2, "d")]) == {}
    assert target.rows("SELECT ticket_id, label, confidence, due, meta->>'n' FROM scores ORDER BY 1") == [
        (1, "c", 0.9, dt.date(2026, 12, 1), "1"),
        (2, "d", 0.5, dt.date(2026, 12, 1), "1"),
    ]


def test_an_update_batch_casts_each_value_to_its_columns_type_and_adds_no_row(target: Target) -> None:
    target.execute("INSERT INTO scores (ticket_id) VALUES (1), (2), (3)")
    with sink("update").open() as writer:
        assert writer.write([row(1, "a", 0.25), row(3, "c"), row(7, "none")]) == {}
    assert target.rows("SELECT ticket_id, label, confidence, due, meta->>'n' FROM scores ORDER BY 1") == [
        (1, "a", 0.25, dt.date(2026, 12, 1), "1"),
        (2, None, None, None, None),
        (3, "c", 0.5, dt.date(2026, 12, 1), "1"),
    ]


@pytest.mark.parametrize("mode", ["upsert", "update"])
def test_a_refused_row_in_a_batch_is_named_with_the_databases_message_and_the_others_are_written(
    target: Target, mode: str
) -> None:
    target.execute("INSERT INTO scores (ticket_id) VALUES (1), (2), (3)")
    with sink(mode).open() as writer:
        refused = writer.write([row(1, "a"), row(2, "bad"), row(3, "c")])
    assert list(refused) == [1] and "check" in refused[1].lower() and refused[1].startswith("CheckViolation")
    assert target.rows("SELECT ticket_id, label FROM scores ORDER BY 1") == [(1, "a"), (2, None), (3, "c")]


def test_a_batch_after_a_refused_one_on_the_same_connection_is_written_and_a_value_of_the_wrong_type_is_refused(
    target: Target,
) -> None:
    with sink("upsert").open() as writer:
        refused = writer.write([row(1, "a"), row(2, "bad")])  # rolled back whole, then row by row
        assert list(refused) == [1]
        bad_date = SinkRow(
            {"ticket_id": 4}, {"label": "d", "confidence": 0.5, "due": "not a date", "meta": None}
        )
        refused = writer.write([row(3, "c"), bad_date, row(5, "e")])
        assert list(refused) == [1] and refused[1].startswith(("InvalidDatetimeFormat", "DataError"))
        assert writer.write([row(6, "f"), row(1, "g")]) == {}
    assert target.rows("SELECT ticket_id, label FROM scores ORDER BY 1") == [
        (1, "g"),
        (3, "c"),
        (5, "e"),
        (6, "f"),
    ]


@pytest.mark.parametrize("mode", ["upsert", "update"])
def test_a_psycopg2_connection_gets_the_same_rows_as_the_hooks_psycopg_3_one(
    target: Target, mode: str
) -> None:
    import psycopg2
    from sqlalchemy.engine import make_url

    from airflow_batch_provider.sinks.sql import _DbApiWriter

    url = make_url(target.url)
    conn = psycopg2.connect(host=url.host, port=url.port, user=url.username, dbname=url.database)
    target.execute("INSERT INTO scores (ticket_id) VALUES (1), (2)")
    try:
        upsert = sink(mode)
        writer = PgBatchWriter(upsert, conn, _DbApiWriter(upsert, conn, upsert.statement("%s")))
        refused = writer.write([row(1, "a", 0.25), row(2, "bad"), row(3, "c")])
        assert list(refused) == [1] and refused[1].startswith("CheckViolation")
        assert writer.write([row(2, "b"), row(1, "x"), row(1, "y")]) == {}
    finally:
        conn.close()
    expected = [(1, "y", 0.5), (2, "b", 0.5)] + ([(3, "c", 0.5)] if mode == "upsert" else [])
    assert target.rows("SELECT ticket_id, label, confidence FROM scores ORDER BY 1") == expected


def test_a_psycopg_3_batch_travels_by_copy_into_a_temporary_table_of_the_target_columns_types(
    target: Target,
) -> None:
    with sink("upsert").open() as writer:
        assert isinstance(writer, PgBatchWriter)
        assert writer.write([row(1, "a")]) == {}
        cursor = writer.conn.cursor()
        cursor.execute(
            "SELECT a.attname, format_type(a.atttypid, a.atttypmod) FROM pg_class c"
            " JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0"
            " WHERE c.relname LIKE 'abp_stage_%' AND c.relpersistence = 't' ORDER BY a.attnum"
        )
        staged = cursor.fetchall()
        cursor.close()
    assert staged == [
        ("ticket_id", "integer"),
        ("label", "text"),
        ("confidence", "double precision"),
        ("due", "date"),
        ("meta", "jsonb"),
    ]
