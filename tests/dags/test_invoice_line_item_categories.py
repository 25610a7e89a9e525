"""Chaining across DAGs: the invoice extraction's publish updates an Asset, and the line item DAG is scheduled on it.

Real Airflow: both shipped DAGs are serialized into the metadata database (as the DAG processor
does) and the line item DAG is unpaused, ``airflow dags test invoice_entity_extraction`` runs step 1 against the emulator, and its
publish records an event of the ``invoice_fields`` Asset, which queues a run of
``invoice_line_item_categories`` (what the scheduler turns into a DAG run). ``airflow dags test
invoice_line_item_categories`` then runs step 2, which reads the answers step 1 published.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from airflow_batch_provider.ledger import Ledger
from batch_emulator import model
from batch_emulator.testing import run_emulator
from tests.support.airflow_run import FAST, anthropic_connection, batch_env, run_airflow, tail
from tests.support.invoices import generated_invoices

pytestmark = pytest.mark.airflow_e2e

URI = "abp://invoice_extraction/results"


QUEUED = "SELECT q.target_dag_id FROM asset_dag_run_queue q JOIN asset a ON a.id = q.asset_id WHERE a.uri = ?"


@dataclass
class Ran:
    ledger: Ledger
    airflow_db: Path
    output: str = ""
    queued: list[tuple[Any, ...]] = field(default_factory=list)

    def items(self, workload: str) -> dict[str, dict[str, Any]]:
        (run,) = self.ledger.runs(workload)
        return {str(r["app_id"]): dict(r) for r in self.ledger.iter_items(workload, run["run_id"])}

    def query(self, sql: str) -> list[tuple[Any, ...]]:
        with sqlite3.connect(self.airflow_db) as db:
            return list(db.execute(sql, (URI,)))


@pytest.fixture(scope="module")
def ran(airflow_home: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Ran]:
    tmp = tmp_path_factory.mktemp("line_items")
    with run_emulator(FAST) as url:
        env = batch_env(
            airflow_home,
            tmp,
            {"anthropic_batch_default": anthropic_connection(url)},
        )
        env["ABP_SAMPLE_DATA_DIR"] = str(tmp / "data")
        for command in (("dags", "reserialize"), ("dags", "unpause", "invoice_line_item_categories")):
            proc = run_airflow(env, *command)
            assert proc.returncode == 0, tail(proc)
        ledger = Ledger.from_url(env["AIRFLOW__BATCH_PROVIDER__LEDGER_URL"])
        ran = Ran(ledger, Path(env["AIRFLOW_HOME"]) / "airflow.db")
        assert ran.query(QUEUED) == []
        for dag_id in ("invoice_entity_extraction", "invoice_line_item_categories"):
            proc = run_airflow(env, "dags", "test", dag_id)
            assert proc.returncode == 0, tail(proc)
            ran.output += proc.stdout + proc.stderr
            if dag_id == "invoice_entity_extraction":
                ran.queued = ran.query(QUEUED)  # what the scheduler would start
        yield ran


def test_step_ones_publish_records_the_asset_event_that_queues_the_line_item_dag(ran: Ran) -> None:
    events = ran.query("SELECT e.extra FROM asset_event e JOIN asset a ON a.id = e.asset_id WHERE a.uri = ?")
    assert len(events) >= 1
    assert json.loads(events[-1][0])["workload"] == "invoice_extraction"
    assert ran.queued == [("invoice_line_item_categories",)]


def test_the_line_item_dag_categorises_each_line_of_each_invoice_step_one_answered(ran: Ran) -> None:
    step1 = ran.items("invoice_extraction")
    answered = {app_id for app_id, r in step1.items() if r["state"] == "succeeded"}
    assert answered and len(answered) < len(step1)  # the invoices in review give no line
    docs = {i["id"]: i for i in generated_invoices(600)}
    expected = {
        f"{app_id}:{n}": (line, json.loads(step1[app_id]["output_json"])["currency"])
        for app_id in answered
        for n, line in enumerate(model.extract_invoice(docs[app_id]["document"])["line_items"])
    }
    step2 = ran.items("invoice_line_items")
    assert set(step2) == set(expected)
    assert {r["state"] for r in step2.values()} == {"succeeded"}
    for app_id, (line, currency) in expected.items():
        answer = json.loads(step2[app_id]["output_json"])
        assert answer == model.categorise(f"Line: {line['description']} ({currency} {line['amount']})"), (
            app_id
        )
    categories = {json.loads(r["output_json"])["category"] for r in step2.values()}
    assert {"office_supplies", "furniture", "it_hardware", "software", "services", "logistics"} <= categories
    assert "reading the answers workload 'invoice_extraction' published in run" in ran.output
