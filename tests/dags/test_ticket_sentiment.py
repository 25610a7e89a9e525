"""Support tickets in PostgreSQL, classified through the emulator's batch API, labels written back onto each row.

Real Airflow (``airflow dags test``), the real ``openai`` SDK over HTTP to the emulator, a real
PostgreSQL behind a ``postgres`` Airflow connection and its hook.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, text

from airflow_batch_provider.ledger import Ledger
from airflow_batch_provider.ledger.deliveries import delivery_rows
from tests.support.airflow_run import openai_dag_env, run_airflow, tail

pytestmark = pytest.mark.airflow_e2e
DAGS = Path(__file__).parent / "dags"
WORKLOAD = "ticket_sentiment"
TICKETS = 60
BODIES = (
    "The refund was slow and left me disappointed.",
    "The login screen of the app is excellent, I love it.",
    "The gift wrapping was okay, nothing special.",
)


def test_every_tickets_row_gets_its_label_and_confidence_once_and_no_row_is_added(
    airflow_home: dict[str, str], tmp_path: Path, postgres_server: Any
) -> None:
    name = postgres_server.create_database("support_tickets")
    engine = create_engine(postgres_server.url_for(name))
    try:
        with engine.begin() as conn:
            conn.execute(
                text(
                    "CREATE TABLE tickets (ticket_id INTEGER PRIMARY KEY, channel TEXT, product TEXT, body TEXT,"
                    " sentiment TEXT, confidence DOUBLE PRECISION)"
                )
            )
            conn.execute(
                text(
                    "INSERT INTO tickets (ticket_id, channel, product, body) VALUES (:i, 'email', 'Lamp', :b)"
                ),
                [{"i": 1000 + i, "b": BODIES[i % 3]} for i in range(TICKETS)],
            )
        db = {"conn_type": "postgres", "host": "127.0.0.1", "port": postgres_server.port, "login": "postgres"}
        support_db = {**db, "schema": name}
        with openai_dag_env(airflow_home, tmp_path, dags=DAGS, connections={"support_db": support_db}) as (
            _,
            env,
        ):
            proc = run_airflow(env, "dags", "test", "ticket_sentiment")
        assert proc.returncode == 0, tail(proc)
        with engine.connect() as conn:
            rows = conn.execute(
                text("SELECT ticket_id, sentiment, confidence FROM tickets ORDER BY ticket_id")
            ).all()
        assert [r[0] for r in rows] == [1000 + i for i in range(TICKETS)]  # none added
        ledger = Ledger.from_url(env["AIRFLOW__BATCH_PROVIDER__LEDGER_URL"])
        [run] = ledger.runs(WORKLOAD)
        answers = {
            r["app_id"]: json.loads(r["output_json"])
            for r in ledger.iter_items(WORKLOAD, run["run_id"])
            if r["state"] == "succeeded"
        }
        assert len(answers) == TICKETS
        for ticket_id, sentiment, confidence in rows:
            answer = answers[str(ticket_id)]
            assert (sentiment, confidence) == (answer["sentiment"], answer["confidence"])
            assert sentiment in ("positive", "negative", "neutral")
        recorded = delivery_rows(ledger, WORKLOAD, "tickets")
        assert len(recorded) == TICKETS and {(r["state"], r["writes"]) for r in recorded} == {
            ("delivered", 1)
        }
        report = json.loads(run["report_json"])
        assert report["deliveries"]["tickets"]["delivered"] == TICKETS
    finally:
        engine.dispose()
        postgres_server.drop_database(name)
