"""SqlUpsertSink against a real SQLite file, a real PostgreSQL and a real MariaDB, through real Airflow connections and hooks."""

from __future__ import annotations

import datetime
import os
from pathlib import Path
from typing import Any

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
        # killed after the sink committed its second batch and before the ledger recorded it; the
        # first batch's record runs beside that write: recorded, or not yet (at most two behind)
        env = dict(os.environ)
        assert deliver_in_process(ledger_url, RUN_2, env, "deliver.after_sink_commit=2") == -9
        recorded = [r for r in delivery_rows(w.ledger, WORKLOAD, "tickets") if r["prompt_version"] == "v2"]
        assert len(recorded) in (0, 2), recorded  # the first batch or nothing, never the second
        in_sink = target.rows("SELECT ticket_id FROM tickets WHERE version = 'v2'")
        assert len(in_sink) == 4 and {r["app_id"] for r in recorded} <= {k for (k,) in in_sink}
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
    target.execute(TICKETS.format(extra=", CONSTRAINT no_t1_check CHECK (summary <> 'Summary: t1')"))
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


def test_an_upsert_updates_the_mapped_columns_in_place_and_leaves_the_rest_of_the_row_and_its_children(
    tmp_path: Path, target: Target
) -> None:
    """A REPLACE (MySQL's through the hook's insert_rows) deletes the row and inserts it again: the
    columns the sink does not map go back to their defaults and ON DELETE CASCADE takes the children."""
    target.execute(
        "CREATE TABLE tickets (ticket_id VARCHAR(20) PRIMARY KEY, body TEXT, summary TEXT, version TEXT)"
    )
    target.execute(
        "CREATE TABLE notes (note_id INTEGER PRIMARY KEY, ticket_id VARCHAR(20), "
        "FOREIGN KEY (ticket_id) REFERENCES tickets (ticket_id) ON DELETE CASCADE)"
    )
    target.execute(
        "INSERT INTO tickets (ticket_id, body, summary) VALUES ('i0', 'b0', 'old'), ('i1', 'b1', 'old')"
    )
    target.execute("INSERT INTO notes (note_id, ticket_id) VALUES (1, 'i0'), (2, 'i1')")
    with world(tmp_path / "w") as w:
        publish_run(w, 3)
        counts = deliver(w.ledger, WORKLOAD, RUN, tickets_sink(batch_size=3))
        assert (counts.written, counts.refused) == (3, 0)
    assert target.rows("SELECT ticket_id, body, summary, version FROM tickets ORDER BY ticket_id") == [
        ("i0", "b0", "Summary: t0", "v1"),
        ("i1", "b1", "Summary: t1", "v1"),
        ("i2", None, "Summary: t2", "v1"),
    ]
    assert target.rows("SELECT note_id, ticket_id FROM notes ORDER BY note_id") == [(1, "i0"), (2, "i1")]


@pytest.mark.parametrize("mode", ["upsert", "update"])
def test_a_key_given_twice_in_a_batch_ends_with_the_later_rows_values(target: Target, mode: str) -> None:
    from airflow_batch_provider.services.delivery import SinkRow

    target.execute(TICKETS.format(extra=""))
    target.execute("INSERT INTO tickets VALUES ('i0', 'before', 'v0')")
    rows = [
        SinkRow({"ticket_id": "i0"}, {"summary": "first", "version": "v1"}),
        SinkRow({"ticket_id": "i1"}, {"summary": "other", "version": "v1"}),
        SinkRow({"ticket_id": "i0"}, {"summary": "second", "version": "v2"}),
    ]
    with tickets_sink(batch_size=3, mode=mode).open() as writer:
        assert writer.write(rows) == {}
    written = target.rows("SELECT ticket_id, summary, version FROM tickets ORDER BY ticket_id")
    expected = [("i0", "second", "v2"), ("i1", "other", "v1")]
    assert written == (expected if mode == "upsert" else expected[:1])


@pytest.mark.parametrize("mode", ["upsert", "update"])
def test_mysql_refuses_a_null_a_too_long_string_and_words_for_a_number_or_a_date_and_writes_the_rest_of_the_batch(
    tmp_path: Path, mysql_server: Any, monkeypatch: pytest.MonkeyPatch, mode: str
) -> None:
    bad_summary = {"i1": None, "i2": "x" * 40}
    sink = SqlUpsertSink(
        conn_id=CONN_ID,
        table="tickets",
        key_columns=["ticket_id"],
        columns={
            "summary": lambda r: bad_summary.get(r.app_id, r.output),
            "priority": lambda r: "urgent" if r.app_id == "i3" else 1,
            "due": lambda r: "someday" if r.app_id == "i4" else "2026-12-31",
        },
        mode=mode,  # type: ignore[arg-type]
        batch_size=6,
    )
    with target_for("mysql", tmp_path, mysql_server) as target, world(tmp_path / "w") as w:
        monkeypatch.setenv(f"AIRFLOW_CONN_{CONN_ID.upper()}", target.conn_json)
        target.execute(
            "CREATE TABLE tickets (ticket_id VARCHAR(20) PRIMARY KEY, summary VARCHAR(20) NOT NULL, "
            "priority INT, due DATE)"
        )
        if mode == "update":
            rows = ", ".join(f"('i{k}', 'before', 0, NULL)" for k in range(6))
            target.execute(f"INSERT INTO tickets VALUES {rows}")
        publish_run(w, 6)
        counts = deliver(w.ledger, WORKLOAD, RUN, sink)
        assert (counts.written, counts.refused) == (2, 4)
        records = delivery_rows(w.ledger, WORKLOAD, "tickets")
        refused = {r["app_id"]: r["error"] for r in records if r["state"] == "refused"}
        written = target.rows("SELECT ticket_id, summary, priority, due FROM tickets ORDER BY ticket_id")
    assert refused == {
        "i1": "IntegrityError: (1048, \"Column 'summary' cannot be null\")",
        "i2": "DataError: (1406, \"Data too long for column 'summary' at row 1\")",
        "i3": "OperationalError: (1366, \"Incorrect integer value: 'urgent' for column "
        f'`{target.database}`.`tickets`.`priority` at row 1")',
        "i4": f"OperationalError: (1292, \"Incorrect date value: 'someday' for column `{target.database}`"
        '.`tickets`.`due` at row 1")',
    }
    kept = [(f"i{k}", "before", 0, None) for k in (1, 2, 3, 4)] if mode == "update" else []
    due = datetime.date(2026, 12, 31)
    assert written == sorted([("i0", "Summary: t0", 1, due), ("i5", "Summary: t5", 1, due), *kept])


@pytest.mark.mysql
def test_without_the_mysql_provider_or_mariadb_the_mysql_tests_skip_but_fail_in_their_lane_and_under_ci(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import importlib.util

    from tests.support.mysql import require_mysql

    provider = importlib.util.find_spec("MySQLdb") is not None
    if not provider:
        with pytest.raises(pytest.skip.Exception, match="make test-mysql"):
            require_mysql(lane=False, ci=True)
        with pytest.raises(pytest.fail.Exception, match="no MySQL provider"):
            require_mysql(lane=True, ci=False)
        return
    monkeypatch.setenv("PATH", str(tmp_path))  # no mariadbd on PATH nor in the folders searched
    monkeypatch.setattr("tests.support.mysql.SEARCH_DIRS", ())
    with pytest.raises(pytest.skip.Exception, match="apt-get install mariadb-server"):
        require_mysql(lane=True, ci=False)
    with pytest.raises(pytest.fail.Exception, match="CI installs it"):
        require_mysql(lane=True, ci=True)


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


def test_a_sql_sink_declares_its_table_through_its_connection_for_lineage() -> None:
    from airflow_batch_provider.core.lineage import DatasetRef

    sink = SqlUpsertSink(
        conn_id="warehouse", table="crm.tickets", key_columns=["id"], columns={"label": "$.label"}
    )
    assert sink.dataset == DatasetRef("table", "crm.tickets", "warehouse")
