"""A delivery reads a run's answers a page at a time, each with the sink's record, against a real ledger and sink."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event, text

from airflow_batch_provider.ledger import candidates
from airflow_batch_provider.ledger.deliveries import Delivery, delivery_rows, record_deliveries
from airflow_batch_provider.ledger.digests import delivery_key
from airflow_batch_provider.services import delivery
from airflow_batch_provider.services.delivery import deliver
from tests.unit.services.workload import RUN, WORKLOAD, world
from tests.unit.sinks.target import CONN_ID, Target, publish_run, target_for, tickets_sink

PAGE = 20


def touched(plan: dict[str, Any], table: str) -> int:
    """Rows a plan (``EXPLAIN (ANALYZE, FORMAT JSON)``) read from ``table``: kept or filtered, in every loop."""
    own = 0
    if plan.get("Relation Name") == table:
        own = (plan["Actual Rows"] + plan.get("Rows Removed by Filter", 0)) * plan["Actual Loops"]
    return own + sum(touched(child, table) for child in plan.get("Plans", []))


@pytest.fixture
def tickets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Target]:
    with target_for("sqlite", tmp_path) as target:
        monkeypatch.setenv(f"AIRFLOW_CONN_{CONN_ID.upper()}", target.conn_json)
        target.execute("CREATE TABLE tickets (ticket_id VARCHAR(20) PRIMARY KEY, summary TEXT, version TEXT)")
        yield target


@pytest.fixture
def sqlite_target(tickets: Target) -> None:
    return None


@pytest.mark.postgres
def test_a_page_of_answers_reads_only_its_own_records_from_a_postgresql_ledger_without_statistics(
    tmp_path: Path, postgres_server: Any, sqlite_target: None
) -> None:
    name = postgres_server.create_database()
    try:
        with world(tmp_path / "w", ledger_url=postgres_server.url_for(name)) as w:
            with w.ledger.engine.begin() as conn:  # no statistics, as in a first delivery's ledger
                conn.execute(text("ALTER TABLE abp_deliveries SET (autovacuum_enabled = false)"))
            earlier = [Delivery(f"k{n}", f"old{n}", "v1", "delivered", "h") for n in range(5000)]
            record_deliveries(w.ledger, WORKLOAD, "tickets", "an_earlier_run", earlier)
            publish_run(w, 2 * PAGE)
            reads: list[tuple[str, Any]] = []

            def seen(_c: Any, _cur: Any, statement: str, params: Any, _ctx: Any, many: bool) -> None:
                if statement.lstrip().upper().startswith("SELECT") and "abp_deliveries" in statement:
                    reads.append((statement, params))

            event.listen(w.ledger.engine, "before_cursor_execute", seen)
            counts = deliver(w.ledger, WORKLOAD, RUN, tickets_sink(batch_size=PAGE))
            event.remove(w.ledger.engine, "before_cursor_execute", seen)
            assert counts.written == 2 * PAGE
            assert reads
            with w.ledger.engine.connect() as conn:
                for statement, params in reads:
                    found: Any = conn.exec_driver_sql(
                        f"EXPLAIN (ANALYZE, FORMAT JSON) {statement}", params
                    ).scalar()
                    plan = (json.loads(found) if isinstance(found, str) else found)[0]["Plan"]
                    # the page's own records at most; a walk of the sink's 5,000 earlier records is a
                    # delivery quadratic in the run's size
                    assert touched(plan, "abp_deliveries") <= 2 * PAGE, json.dumps(plan, indent=1)[:3000]
    finally:
        postgres_server.drop_database(name)


BATCH = 4
BATCHES = 6


def in_sink(target: Target) -> set[str]:
    return {key for (key,) in target.rows("SELECT ticket_id FROM tickets")}


def recorded(ledger: Any) -> set[str]:
    return {
        row["app_id"] for row in delivery_rows(ledger, WORKLOAD, "tickets") if row["state"] == "delivered"
    }


def test_each_batch_is_recorded_only_after_the_sink_committed_it_and_never_more_than_two_batches_later(
    tmp_path: Path, ledger_url: str, tickets: Target, monkeypatch: pytest.MonkeyPatch
) -> None:
    with world(tmp_path / "w", ledger_url=ledger_url) as w:
        publish_run(w, BATCH * BATCHES)
        behind: list[int] = []
        committed: set[str] = set()
        early: set[str] = set()  # checked here: a failed assert on the record's thread may go unread
        write, record = delivery._Batch.write, delivery._Batch.record

        def writing(batch: Any, todo: Any) -> Any:
            behind.append(len(in_sink(tickets) - recorded(w.ledger)))  # committed, not recorded yet
            time.sleep(0.02)  # a slow sink: a record that does not wait for its commit runs first
            rejected = write(batch, todo)
            committed.update(result.app_id for result, _, _ in todo)
            return rejected

        def recording(batch: Any, todo: Any, refused: Any, rejected: Any) -> Any:
            early.update({result.app_id for result, _, _ in todo} - committed)
            time.sleep(0.05)  # a slow ledger: the sink must not run ahead of it by more than two batches
            return record(batch, todo, refused, rejected)

        monkeypatch.setattr(delivery._Batch, "write", writing)
        monkeypatch.setattr(delivery._Batch, "record", recording)
        counts = deliver(w.ledger, WORKLOAD, RUN, tickets_sink(batch_size=BATCH))
        assert not early, f"recorded before the sink committed them: {early}"
        assert len(behind) == BATCHES and max(behind) <= 2 * BATCH, behind
        assert counts.written == BATCH * BATCHES
        assert recorded(w.ledger) == in_sink(tickets) and len(in_sink(tickets)) == BATCH * BATCHES


@pytest.mark.parametrize("failing", ["the sink", "the reading"])
def test_a_delivery_failing_on_a_later_batch_leaves_every_batch_the_sink_committed_recorded_and_a_rerun_writes_the_rest(
    tmp_path: Path, ledger_url: str, tickets: Target, monkeypatch: pytest.MonkeyPatch, failing: str
) -> None:
    with world(tmp_path / "w", ledger_url=ledger_url) as w:
        publish_run(w, BATCH * BATCHES)
        write, pages, calls = delivery._Batch.write, delivery.candidate_pages, []

        def failing_sink(batch: Any, todo: Any) -> Any:
            calls.append(len(todo))
            if len(calls) == 4:
                raise RuntimeError("the target went away")
            return write(batch, todo)

        def failing_reads(*args: Any) -> Iterator[Any]:
            for page in pages(*args):
                calls.append(len(page))
                yield page
                if len(calls) == 3:  # three batches handed to the sink, the last one still in it
                    raise RuntimeError("the ledger went away")

        if failing == "the sink":
            monkeypatch.setattr(delivery._Batch, "write", failing_sink)
        else:
            monkeypatch.setattr(delivery, "candidate_pages", failing_reads)
        with pytest.raises(RuntimeError, match="went away") as failed:
            deliver(w.ledger, WORKLOAD, RUN, tickets_sink(batch_size=BATCH))
        # every ledger connection back in its pool while the failure's traceback (its frames) is kept
        assert failed.traceback and w.ledger.engine.pool.checkedout() == 0  # type: ignore[attr-defined]
        assert len(in_sink(tickets)) == 3 * BATCH
        assert recorded(w.ledger) == in_sink(tickets)  # what the sink committed before the failure
        monkeypatch.setattr(delivery._Batch, "write", write)
        monkeypatch.setattr(delivery, "candidate_pages", pages)
        again = deliver(w.ledger, WORKLOAD, RUN, tickets_sink(batch_size=BATCH))
        assert (again.written, again.unchanged) == ((BATCHES - 3) * BATCH, 3 * BATCH)
        assert recorded(w.ledger) == in_sink(tickets) and len(in_sink(tickets)) == BATCH * BATCHES


def test_a_reading_connection_that_fails_to_close_after_a_failed_mapping_still_leaves_every_committed_batch_recorded(
    tmp_path: Path, ledger_url: str, tickets: Target, monkeypatch: pytest.MonkeyPatch
) -> None:
    with world(tmp_path / "w", ledger_url=ledger_url) as w:
        publish_run(w, BATCH * BATCHES)
        rows, calls = delivery._rows, []

        def failing_mapping(*args: Any) -> Any:  # the third batch is in the sink, not yet recorded
            calls.append(1)
            if len(calls) == 4:
                raise RuntimeError("the mapping went away")
            return rows(*args)

        def failing_close(reader: Any) -> None:
            raise RuntimeError("the ledger's connection went away too")

        monkeypatch.setattr(delivery, "_rows", failing_mapping)
        for reader in (candidates._JsonPage, candidates._TwoReads):
            monkeypatch.setattr(reader, "close", failing_close)
        with pytest.raises(RuntimeError, match="went away"):
            deliver(w.ledger, WORKLOAD, RUN, tickets_sink(batch_size=BATCH))
        assert len(in_sink(tickets)) == 3 * BATCH
        assert recorded(w.ledger) == in_sink(tickets)  # recorded before the pages were closed


def test_a_sink_in_the_ledgers_own_sqlite_file_gets_every_row_once_its_writes_taking_turns_with_the_records(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the sink's thread and the record's thread both write the one file: each waits out the other's
    # write lock (SQLite's busy timeout), neither is refused
    ledger_path = tmp_path / "ledger.sqlite"
    with world(tmp_path, ledger_url=f"sqlite:///{ledger_path}") as w:
        target = Target(
            f"sqlite:///{ledger_path}", json.dumps({"conn_type": "sqlite", "host": str(ledger_path)})
        )
        monkeypatch.setenv(f"AIRFLOW_CONN_{CONN_ID.upper()}", target.conn_json)
        target.execute("CREATE TABLE tickets (ticket_id VARCHAR(20) PRIMARY KEY, summary TEXT, version TEXT)")
        publish_run(w, BATCH * BATCHES)
        counts = deliver(w.ledger, WORKLOAD, RUN, tickets_sink(batch_size=BATCH))
        again = deliver(w.ledger, WORKLOAD, RUN, tickets_sink(batch_size=BATCH))
        assert (counts.written, again.written, again.unchanged) == (BATCH * BATCHES, 0, BATCH * BATCHES)
        assert recorded(w.ledger) == in_sink(target) and len(in_sink(target)) == BATCH * BATCHES


def test_a_delivery_records_its_rows_without_their_delivery_keys_and_reads_them_back_with_them(
    tmp_path: Path, ledger_url: str, tickets: Target
) -> None:
    # a batch with a refused row (recorded row by row) and a batch taken whole (recorded at once):
    # neither stores the key (nothing looks a sink's row up by it); delivery_rows derives it
    tickets.execute("DROP TABLE tickets")
    tickets.execute(
        "CREATE TABLE tickets (ticket_id VARCHAR(20) PRIMARY KEY, summary TEXT, version TEXT, "
        "CHECK (ticket_id <> 'i1'))"
    )
    with world(tmp_path / "w", ledger_url=ledger_url) as w:
        publish_run(w, 2 * BATCH)
        counts = deliver(w.ledger, WORKLOAD, RUN, tickets_sink(batch_size=BATCH))
        assert (counts.written, counts.refused) == (2 * BATCH - 1, 1)
        with w.ledger.engine.connect() as conn:
            stored = conn.execute(text("SELECT state, delivery_key FROM abp_deliveries")).all()
        assert sorted(stored) == sorted([("delivered", "")] * (2 * BATCH - 1) + [("refused", "")])
        rows = delivery_rows(w.ledger, WORKLOAD, "tickets")
        assert [row["delivery_key"] for row in rows] == [
            delivery_key(WORKLOAD, "tickets", row["app_id"], row["prompt_version"]) for row in rows
        ]
