"""BatchDeliverOperator: a real SQLite target behind an Airflow connection, the emulator's answers, a real ledger and staging."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from airflow_batch_provider.operators.deliver import BatchDeliverOperator
from tests.unit.services.workload import RUN, WORKLOAD, world
from tests.unit.sinks.target import CONN_ID, publish_run, target_for, tickets_sink

TICKETS = (
    "CREATE TABLE tickets (ticket_id VARCHAR(20) PRIMARY KEY, summary TEXT NOT NULL, version TEXT{extra})"
)


def test_each_delivery_puts_its_sinks_delivered_unchanged_and_refused_counts_in_report_json(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with target_for("sqlite", tmp_path) as target, world(tmp_path / "w") as w:
        monkeypatch.setenv(f"AIRFLOW_CONN_{CONN_ID.upper()}", target.conn_json)
        monkeypatch.setenv("AIRFLOW__BATCH_PROVIDER__LEDGER_URL", str(w.ledger.engine.url))
        target.execute(TICKETS.format(extra=", CHECK (summary <> 'Summary: t1')"))
        publish_run(w, 3)
        folder = w.staging.run_dir(WORKLOAD, RUN)
        w.ledger.finish_run(WORKLOAD, RUN, {"items": 3})
        with w.staging.writer(folder / "report.json") as fh:  # as publish wrote it
            fh.write(json.dumps({"items": 3}).encode("utf-8"))
        operator = BatchDeliverOperator(
            task_id="deliver_tickets",
            workload=WORKLOAD,
            sink=tickets_sink(batch_size=3),
            staging_root=str(w.staging.root),
        )
        first = operator.execute({"run_id": RUN})
        assert (first["written"], first["unchanged"], first["refused"]) == (2, 0, 1)
        again = operator.execute({"run_id": RUN})  # the task cleared
        assert (again["written"], again["unchanged"], again["refused"]) == (0, 2, 1)

        written = json.loads((folder / "report.json").read_text())
        stored = json.loads(w.ledger.runs(WORKLOAD)[0]["report_json"])
    expected = {"delivered": 2, "unchanged": 2, "refused": 1}
    assert {k: written["deliveries"]["tickets"][k] for k in expected} == expected
    assert written["items"] == 3 and written["deliveries"] == stored["deliveries"]
    assert written["deliveries"]["tickets"]["messages"][0].startswith("i1: ")
