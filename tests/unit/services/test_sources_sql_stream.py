"""A PostgreSQL source read through one server-side cursor (its real Airflow connection and hook), a page per fetch."""

from __future__ import annotations

import datetime as dt
import uuid
from decimal import Decimal
from pathlib import Path

import pytest

from airflow_batch_provider.core.requests import PromptTemplate
from airflow_batch_provider.ledger import Ledger
from airflow_batch_provider.operators.sources import read_sql_source
from airflow_batch_provider.services.records import Reject, load_records
from airflow_batch_provider.services.sources_sql import SqlPaging, SqlSource
from tests.support.postgres import PostgresServer

RUN = "manual__2026-12-01T00:00:00+00:00"


@pytest.mark.postgres
def test_a_postgresql_query_streams_its_rows_with_json_safe_values(
    postgres_server: PostgresServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    name = postgres_server.create_database(f"src_{uuid.uuid4().hex[:12]}")
    try:
        postgres_server.execute(
            "CREATE TABLE tickets (id text PRIMARY KEY, body text, price numeric(8, 2), opened timestamptz,"
            " due date, raw bytea, ref uuid, meta jsonb, span int4range)",
            dbname=name,
        )
        postgres_server.execute(
            "INSERT INTO tickets SELECT 't' || lpad(i::text, 3, '0'), 'body ' || i, i * 1.25,"
            " timestamptz '2026-12-01 10:00+00' + i * interval '1 hour', date '2026-12-01', 'x'::bytea,"
            " '6f1c3e9a-8a37-4a1e-9d3c-2f9e8c1d0b7a', jsonb_build_object('n', i), NULL FROM generate_series(1, 30) i",
            dbname=name,
        )
        postgres_server.execute("UPDATE tickets SET span = int4range(1, 5) WHERE id = 't007'", dbname=name)
        monkeypatch.setenv(
            "AIRFLOW_CONN_TICKETS_DB",
            f"postgresql://postgres@{postgres_server.host}:{postgres_server.port}/{name}",
        )
        source = SqlSource(
            conn_id="tickets_db",
            sql="SELECT * FROM tickets WHERE body LIKE 'body %'",
            page_size=8,
        )
        paging = SqlPaging()
        records = list(read_sql_source(source, "id", paging))
        assert (len(records), paging.pages, paging.largest_page) == (30, 4, 8)
        first = records[0].value or {}
        assert first["id"] == "t001"
        assert first["price"] == "1.25" and isinstance(first["price"], str)
        assert first["opened"] == dt.datetime(2026, 12, 1, 11, tzinfo=dt.timezone.utc).isoformat()
        assert first["due"] == "2026-12-01" and first["raw"] == "x"
        assert first["ref"] == "6f1c3e9a-8a37-4a1e-9d3c-2f9e8c1d0b7a" and first["meta"] == {"n": 1}
        bad = [r for r in records if r.problem is not None]
        assert [(r.value or {}).get("id") for r in bad] == ["t007"]
        code, reason = bad[0].problem or ("", "")
        assert code == "unsupported_value" and "column 'span'" in reason and "CAST(span AS TEXT)" in reason
        assert "page 1, row 7" in reason
        assert Decimal(first["price"]) == Decimal("1.25")
    finally:
        postgres_server.drop_database(name)


@pytest.mark.postgres
def test_a_postgresql_source_is_read_through_one_server_side_cursor_a_page_per_fetch(
    postgres_server: PostgresServer, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    name = postgres_server.create_database(f"src_{uuid.uuid4().hex[:12]}")
    try:
        postgres_server.execute("CREATE TABLE tickets (ticket_id int, text text)", dbname=name)
        postgres_server.execute(
            "INSERT INTO tickets SELECT i, 'ticket ' || i FROM generate_series(1, 25) i"
            " UNION ALL SELECT 4, 'a second 4' UNION ALL SELECT NULL, 'no id'",
            dbname=name,
        )
        monkeypatch.setenv(
            "AIRFLOW_CONN_TICKETS_DB",
            f"postgresql://postgres@{postgres_server.host}:{postgres_server.port}/{name}",
        )
        source = SqlSource(
            conn_id="tickets_db", sql="SELECT * FROM tickets", id_column="ticket_id", page_size=10
        )
        paging = SqlPaging()
        reader = read_sql_source(source, "id", paging)
        next(reader)
        # the reading session's last statement is a FETCH from its named (server-side) cursor; the
        # sessions that set the table up may still be listed while their backends exit (a loaded
        # machine), with their own last statements, so the reader's is the one FETCH among them
        sessions = postgres_server.execute(
            "SELECT query FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
            " AND backend_type = 'client backend'",
            dbname=name,
        )
        fetches = [query for (query,) in sessions if query.upper().startswith("FETCH")]
        assert len(fetches) == 1, sessions
        ledger = Ledger.from_url(f"sqlite:///{tmp_path / 'ledger.sqlite'}")
        rejects: list[Reject] = []
        result = load_records(
            ledger=ledger,
            workload="w",
            run_id=RUN,
            template=PromptTemplate(version="v1", model="gpt-4o-mini", user="{{ text }}"),
            records=read_sql_source(source, "id"),
            write_reject=rejects.append,
        )
        rest = list(reader)
        assert [(r.value or {}).get("ticket_id") for r in rest][:4] == [2, 3, 4, 4]
        assert len(paging.queries) == 1 and (paging.pages, paging.largest_page) == (3, 10)
        assert (result.read, result.items, result.rejected) == (27, 25, 2)
        assert sorted(r.code for r in rejects) == ["duplicate_id", "missing_id"]
        assert any("with a NULL id" in r.message for r in rejects)
    finally:
        postgres_server.drop_database(name)
