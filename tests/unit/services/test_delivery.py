"""A delivery reads a run's answers a page at a time, each with the sink's record, against a real ledger and sink."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event, text

from airflow_batch_provider.ledger.deliveries import Delivery, record_deliveries
from airflow_batch_provider.services.delivery import deliver
from tests.unit.services.workload import RUN, WORKLOAD, world
from tests.unit.sinks.target import CONN_ID, publish_run, target_for, tickets_sink

PAGE = 20


def touched(plan: dict[str, Any], table: str) -> int:
    """Rows a plan (``EXPLAIN (ANALYZE, FORMAT JSON)``) read from ``table``: kept or filtered, in every loop."""
    own = 0
    if plan.get("Relation Name") == table:
        own = (plan["Actual Rows"] + plan.get("Rows Removed by Filter", 0)) * plan["Actual Loops"]
    return own + sum(touched(child, table) for child in plan.get("Plans", []))


@pytest.fixture
def sqlite_target(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    with target_for("sqlite", tmp_path) as target:
        monkeypatch.setenv(f"AIRFLOW_CONN_{CONN_ID.upper()}", target.conn_json)
        target.execute("CREATE TABLE tickets (ticket_id VARCHAR(20) PRIMARY KEY, summary TEXT, version TEXT)")
        yield


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
