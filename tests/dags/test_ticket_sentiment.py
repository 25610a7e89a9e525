"""The README's "from a table and back" DAG (``dags/ticket_sentiment.py``), run as shipped.

Support tickets in PostgreSQL, read through a ``SqlSource``, classified through the emulator's
batch API, the labels written back onto each row by a ``SqlUpsertSink``. Real Airflow (``airflow
dags test``), the real ``openai`` SDK over HTTP to the emulator, a real PostgreSQL behind a
``postgres`` Airflow connection and its hook.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, text

from airflow_batch_provider.ledger import Ledger
from airflow_batch_provider.ledger.deliveries import delivery_rows
from tests.support.airflow_run import openai_dag_env, run_airflow, tail

pytestmark = pytest.mark.airflow_e2e
REPO = Path(__file__).resolve().parents[2]
DAG_FILE = REPO / "dags" / "ticket_sentiment.py"  # shipped, and shown verbatim in the README
PROMPT_FILE = REPO / "include" / "prompts" / "feedback_classification.yaml"


def shipped_dag_folder(root: Path) -> Path:
    """A DAG folder holding the shipped DAG file alone, with the prompt in the include folder beside it, where the file looks.

    Only this file is parsed, not the other shipped DAGs (the vLLM ones import the Kubernetes client).
    """
    (root / "dags").mkdir(parents=True)
    (root / "include" / "prompts").mkdir(parents=True)
    shutil.copy(DAG_FILE, root / "dags" / DAG_FILE.name)
    shutil.copy(PROMPT_FILE, root / "include" / "prompts" / PROMPT_FILE.name)
    return root / "dags"


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
        bundle = shipped_dag_folder(tmp_path / "bundle")
        with openai_dag_env(airflow_home, tmp_path, dags=bundle, connections={"support_db": support_db}) as (
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
