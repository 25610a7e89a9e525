"""Which statement the SQL sink writes on which database; another database's hook only where it upserts."""

from __future__ import annotations

from typing import Any

import pytest

from airflow_batch_provider.exceptions import ConfigurationError
from airflow_batch_provider.services.delivery import SinkRow
from airflow_batch_provider.sinks.dialects import UPSERTS, row_statement, upsert_of
from airflow_batch_provider.sinks.sql import _HookWriter
from tests.unit.sinks.conftest import MYSQL, POSTGRESQL, SQLITE
from tests.unit.sinks.target import CONN_ID, Target, tickets_sink

TICKETS = "CREATE TABLE tickets (ticket_id VARCHAR(20) PRIMARY KEY, body TEXT, summary TEXT, version TEXT)"


def test_each_connection_type_names_its_upsert_and_the_others_go_through_their_hook() -> None:
    assert dict(UPSERTS) == {
        "postgres": "on_conflict",
        "postgresql": "on_conflict",
        "sqlite": "on_conflict",
        "mysql": "on_duplicate_key",
    }
    assert upsert_of("MySQL") == "on_duplicate_key"
    assert upsert_of("snowflake") is None and upsert_of("mssql") is None


def test_mysql_updates_the_mapped_columns_in_place_by_values_and_postgresql_and_sqlite_by_excluded() -> None:
    keys, columns = ["ticket_id", "version"], ["summary", "label"]
    assert row_statement("upsert", "on_duplicate_key", "crm.tickets", keys, columns, "%s") == (
        "INSERT INTO crm.tickets (ticket_id, version, summary, label) VALUES (%s, %s, %s, %s) "
        "ON DUPLICATE KEY UPDATE summary = VALUES(summary), label = VALUES(label)"
    )
    assert row_statement("upsert", "on_conflict", "tickets", keys, columns, "?") == (
        "INSERT INTO tickets (ticket_id, version, summary, label) VALUES (?, ?, ?, ?) "
        "ON CONFLICT (ticket_id, version) DO UPDATE SET summary = excluded.summary, label = excluded.label"
    )
    update = "UPDATE tickets SET summary = %s, label = %s WHERE ticket_id = %s AND version = %s"
    for upsert in ("on_conflict", "on_duplicate_key"):
        assert row_statement("update", upsert, "tickets", keys, columns, "%s") == update  # type: ignore[arg-type]


def connection_hook() -> Any:
    """The hook of the sink's connection (the target's), as a database with no upsert here would get it."""
    from airflow.sdk import BaseHook

    return BaseHook.get_connection(CONN_ID).get_hook()


@pytest.mark.parametrize("target", [POSTGRESQL], indirect=True)
def test_a_hook_whose_insert_rows_replace_is_an_upsert_writes_through_it_and_leaves_the_other_columns(
    target: Target,
) -> None:
    target.execute(TICKETS)
    target.execute("INSERT INTO tickets (ticket_id, body) VALUES ('i0', 'b0')")
    writer = _HookWriter(tickets_sink(), connection_hook())  # its dialect writes ON CONFLICT DO UPDATE
    for summary in ("first", "second"):
        rows = [SinkRow({"ticket_id": k}, {"summary": summary, "version": "v1"}) for k in ("i0", "i1")]
        assert writer.write(rows) == {}
    assert target.rows("SELECT ticket_id, body, summary FROM tickets ORDER BY ticket_id") == [
        ("i0", "b0", "second"),
        ("i1", None, "second"),
    ]


@pytest.mark.parametrize("target", [SQLITE, MYSQL], indirect=True)
def test_a_hook_whose_insert_rows_replace_deletes_and_inserts_is_refused_before_anything_is_written(
    target: Target,
) -> None:
    target.execute(TICKETS)
    target.execute("INSERT INTO tickets (ticket_id, body) VALUES ('i0', 'b0')")
    hook = connection_hook()
    writer = _HookWriter(tickets_sink(), hook)
    with pytest.raises(ConfigurationError) as refused:
        writer.write([SinkRow({"ticket_id": "i0"}, {"summary": "s", "version": "v1"})])
    message = str(refused.value)
    assert message.startswith(f"sink 'tickets': the {type(hook).__name__} writes no upsert")
    assert "REPLACE INTO tickets (ticket_id, summary, version)" in message
    assert "deletes the row and inserts it again" in message and "use mode='update'" in message
    assert target.rows("SELECT ticket_id, body, summary FROM tickets") == [("i0", "b0", None)]


@pytest.mark.parametrize("target", [MYSQL], indirect=True)
def test_on_mysql_a_row_that_conflicts_on_another_unique_key_updates_that_row_so_the_key_should_be_the_primary(
    target: Target,
) -> None:
    """MySQL's ON DUPLICATE KEY UPDATE fires on any unique key: what the docs warn of (key_columns should be
    the table's primary key, or its only unique key)."""
    target.execute(
        "CREATE TABLE tickets (ticket_id VARCHAR(20) PRIMARY KEY, summary VARCHAR(40) UNIQUE, version TEXT)"
    )
    target.execute("INSERT INTO tickets VALUES ('i0', 'same', 'v0')")
    with tickets_sink().open() as writer:
        assert writer.write([SinkRow({"ticket_id": "i9"}, {"summary": "same", "version": "v1"})]) == {}
    assert target.rows("SELECT ticket_id, summary, version FROM tickets") == [("i0", "same", "v1")]


@pytest.mark.parametrize("target", [MYSQL], indirect=True)
def test_on_mysql_a_batch_is_one_insert_statement_and_an_update_batch_one_commit(target: Target) -> None:
    target.execute(TICKETS)
    rows = [SinkRow({"ticket_id": f"i{k}"}, {"summary": f"s{k}", "version": "v1"}) for k in range(5)]

    def counted(writer: Any, what: str) -> int:
        cursor = writer.conn.cursor()
        cursor.execute(f"SHOW SESSION STATUS LIKE '{what}'")
        return int(cursor.fetchone()[1])

    for mode, statement in (("upsert", "Com_insert"), ("update", "Com_update")):
        with tickets_sink(batch_size=5, mode=mode).open() as writer:
            assert writer.conn.get_autocommit() is False  # the batch is one transaction
            before = {what: counted(writer, what) for what in (statement, "Com_commit")}
            assert writer.write(rows) == {}
            after = {what: counted(writer, what) for what in (statement, "Com_commit")}
        sent = 1 if mode == "upsert" else len(rows)  # mysqlclient's executemany: one multi-row INSERT
        assert after == {statement: before[statement] + sent, "Com_commit": before["Com_commit"] + 1}
    assert target.rows("SELECT COUNT(*), MIN(body), MAX(summary) FROM tickets") == [(5, None, "s4")]
