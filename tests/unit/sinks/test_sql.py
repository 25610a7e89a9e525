"""SqlUpsertSink against a real SQLite file and a real PostgreSQL, through real Airflow connections and hooks."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from airflow_batch_provider.exceptions import ConfigurationError
from airflow_batch_provider.ledger.deliveries import delivery_rows
from airflow_batch_provider.services.delivery import deliver
from airflow_batch_provider.sinks.sql import SqlUpsertSink
from tests.unit.services.workload import PROMPT, RUN, WORKLOAD, world
from tests.unit.sinks.target import (
    CONN_ID,
    Target,
    bumped,
    deliver_in_process,
    publish_run,
    target_for,
    tickets_sink,
)

RUN_2 = "manual__2026-12-01T00:00:00+00:00"
TICKETS = (
    "CREATE TABLE tickets (ticket_id VARCHAR(20) PRIMARY KEY, summary TEXT NOT NULL, version TEXT{extra})"
)


@pytest.fixture(
    params=[
        pytest.param("sqlite", id="sqlite"),
        pytest.param("postgresql", id="postgresql", marks=pytest.mark.postgres),
    ]
)
def target(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Target]:
    server = request.getfixturevalue("postgres_server") if request.param == "postgresql" else None
    with target_for(request.param, tmp_path, server) as found:
        monkeypatch.setenv(f"AIRFLOW_CONN_{CONN_ID.upper()}", found.conn_json)
        yield found


def test_every_target_row_is_written_once_with_the_latest_answer_through_a_clear_a_kill_and_a_prompt_bump(
    tmp_path: Path, target: Target
) -> None:
    target.execute(TICKETS.format(extra=""))
    with world(tmp_path / "w") as w:
        publish_run(w, 5)
        ledger_url = str(w.ledger.engine.url)
        first = deliver(w.ledger, WORKLOAD, RUN, tickets_sink())
        assert (first.written, first.unchanged, first.refused) == (5, 0, 0)
        cleared = deliver(w.ledger, WORKLOAD, RUN, tickets_sink())  # the task cleared: nothing again
        assert (cleared.written, cleared.unchanged) == (0, 5)

        publish_run(w, 5, RUN_2, bumped(PROMPT, "v2"))
        # killed after the sink committed its second batch and before the ledger recorded it
        env = dict(os.environ)
        assert deliver_in_process(ledger_url, RUN_2, env, "deliver.after_sink_commit=2") == -9
        recorded = [r for r in delivery_rows(w.ledger, WORKLOAD, "tickets") if r["prompt_version"] == "v2"]
        assert len(recorded) == 2  # the first batch only
        assert deliver_in_process(ledger_url, RUN_2, env) == 0
        again = deliver(w.ledger, WORKLOAD, RUN_2, tickets_sink())
        assert (again.written, again.unchanged) == (0, 5)

        rows = target.rows("SELECT ticket_id, summary, version FROM tickets ORDER BY ticket_id")
        assert rows == [(f"i{k}", f"Summary: v2 t{k}", "v2") for k in range(5)]
        records = delivery_rows(w.ledger, WORKLOAD, "tickets")
        assert sorted((r["app_id"], r["prompt_version"]) for r in records) == sorted(
            (f"i{k}", v) for k in range(5) for v in ("v1", "v2")
        )
        assert {r["state"] for r in records} == {"delivered"}
        assert {r["writes"] for r in records} == {1}  # no row recorded twice, none rewritten


def test_a_row_the_database_refuses_is_recorded_with_its_message_and_the_rest_of_its_batch_is_written(
    tmp_path: Path, target: Target
) -> None:
    target.execute(TICKETS.format(extra=", CHECK (summary <> 'Summary: t1')"))
    with world(tmp_path / "w") as w:
        publish_run(w, 3)
        counts = deliver(w.ledger, WORKLOAD, RUN, tickets_sink(batch_size=3))
        assert (counts.written, counts.refused) == (2, 1)
        assert counts.messages[0].startswith("i1: ") and "check" in counts.messages[0].lower()
        assert target.rows("SELECT ticket_id FROM tickets ORDER BY ticket_id") == [("i0",), ("i2",)]
        refused = [r for r in delivery_rows(w.ledger, WORKLOAD, "tickets") if r["state"] == "refused"]
        assert [(r["app_id"], "check" in r["error"].lower()) for r in refused] == [("i1", True)]

        target.execute("DROP TABLE tickets")  # the person fixes the table; the next delivery writes the row
        target.execute(TICKETS.format(extra=""))
        target.execute("INSERT INTO tickets VALUES ('i0', 'Summary: t0', 'v1'), ('i2', 'Summary: t2', 'v1')")
        retried = deliver(w.ledger, WORKLOAD, RUN, tickets_sink(batch_size=3))
        assert (retried.written, retried.unchanged, retried.refused) == (1, 2, 0)
        assert target.rows("SELECT ticket_id FROM tickets WHERE ticket_id = 'i1'") == [("i1",)]


def test_update_mode_writes_the_answer_back_onto_the_source_rows_and_adds_none(
    tmp_path: Path, target: Target
) -> None:
    target.execute(
        "CREATE TABLE tickets (ticket_id VARCHAR(20) PRIMARY KEY, body TEXT, summary TEXT, version TEXT)"
    )
    target.execute(
        "INSERT INTO tickets (ticket_id, body) VALUES ('i0', 'b0'), ('i1', 'b1'), ('i2', 'b2'), ('x9', 'other')"
    )
    with world(tmp_path / "w") as w:
        publish_run(w, 3)
        counts = deliver(w.ledger, WORKLOAD, RUN, tickets_sink(mode="update"))
        assert counts.written == 3
    assert target.rows("SELECT ticket_id, body, summary, version FROM tickets ORDER BY ticket_id") == [
        ("i0", "b0", "Summary: t0", "v1"),
        ("i1", "b1", "Summary: t1", "v1"),
        ("i2", "b2", "Summary: t2", "v1"),
        ("x9", "other", None, None),
    ]


def test_a_sink_with_a_key_or_column_that_is_not_an_identifier_is_refused_when_built() -> None:
    with pytest.raises(ConfigurationError, match="not a plain SQL identifier"):
        SqlUpsertSink(conn_id=CONN_ID, table="t; DROP", key_columns=["id"], columns={"a": "$"})
    with pytest.raises(ConfigurationError, match="one column"):
        SqlUpsertSink(conn_id=CONN_ID, table="t", key_columns=[], columns={"a": "$"})
    with pytest.raises(ConfigurationError, match="must start with"):
        SqlUpsertSink(conn_id=CONN_ID, table="t", key_columns=["id"], columns={"a": "label"})
    with pytest.raises(ConfigurationError, match="mode='bulk'"):
        SqlUpsertSink(conn_id=CONN_ID, table="t", key_columns=["id"], columns={"a": "$"}, mode="bulk")  # type: ignore[arg-type]


def test_a_key_type_converts_the_application_id_and_json_paths_read_into_the_answer() -> None:
    from airflow_batch_provider.ledger.candidates import Candidate

    sink = SqlUpsertSink(
        conn_id=CONN_ID,
        table="tickets",
        key_columns=["ticket_id", "version"],
        columns={"label": "$.label", "first": "$.scores[0]", "missing": "$.nope", "whole": "$"},
        key_type=int,
    )
    answer = {"label": "negative", "scores": [0.9, 0.1]}
    row = sink.row_for(Candidate("k", "42", "v3", "succeeded", answer, None, None))
    assert row.keys == {"ticket_id": 42, "version": "v3"}
    assert row.values == {
        "label": "negative",
        "first": 0.9,
        "missing": None,
        "whole": '{"label": "negative", "scores": [0.9, 0.1]}',
    }


def test_a_database_without_on_conflict_here_upserts_through_the_hooks_insert_rows_replace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from airflow.providers.sqlite.hooks.sqlite import SqliteHook

    from airflow_batch_provider.services.delivery import SinkRow
    from airflow_batch_provider.sinks.sql import _ReplaceWriter

    with target_for("sqlite", tmp_path) as target:
        monkeypatch.setenv(f"AIRFLOW_CONN_{CONN_ID.upper()}", target.conn_json)
        target.execute(TICKETS.format(extra=""))
        writer = _ReplaceWriter(tickets_sink(), SqliteHook(sqlite_conn_id=CONN_ID))
        for summary in ("first", "second"):
            assert writer.write([SinkRow({"ticket_id": "i0"}, {"summary": summary, "version": "v1"})]) == {}
        assert target.rows("SELECT ticket_id, summary FROM tickets") == [("i0", "second")]


def test_a_sql_sink_declares_its_table_through_its_connection_for_lineage() -> None:
    from airflow_batch_provider.core.lineage import DatasetRef

    sink = SqlUpsertSink(
        conn_id="warehouse", table="crm.tickets", key_columns=["id"], columns={"label": "$.label"}
    )
    assert sink.dataset == DatasetRef("table", "crm.tickets", "warehouse")
