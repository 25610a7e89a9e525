"""A whole DAG whose records are the rows of a PostgreSQL table, read through an Airflow connection."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest

from airflow_batch_provider.ledger import Ledger
from tests.support.airflow_run import openai_dag_env, run_airflow, tail
from tests.support.postgres import PostgresServer

pytestmark = [pytest.mark.airflow_e2e, pytest.mark.postgres]
DAGS = Path(__file__).parent / "dags"


def test_the_rows_of_a_table_are_all_answered_and_a_bad_row_is_in_review_with_its_reason(
    airflow_home: dict[str, str], postgres_server: PostgresServer, tmp_path: Path
) -> None:
    name = postgres_server.create_database(f"tickets_{uuid.uuid4().hex[:12]}")
    try:
        postgres_server.execute(
            "CREATE TABLE support_tickets (ticket_id text, channel text, product text, comment text)",
            dbname=name,
        )
        postgres_server.execute(
            "INSERT INTO support_tickets SELECT 't' || lpad(i::text, 3, '0'), CASE WHEN i % 5 = 0 THEN 'chat' "
            "ELSE 'email' END, 'Lamp', 'I love the lamp, great ' || i FROM generate_series(1, 40) i",
            dbname=name,
        )
        postgres_server.execute(
            "UPDATE support_tickets SET comment = NULL WHERE ticket_id = 't017'", dbname=name
        )
        postgres_server.execute(
            "INSERT INTO support_tickets VALUES (NULL, 'email', 'Lamp', 'a ticket without an id')",
            dbname=name,
        )
        tickets_db = {
            "conn_type": "postgres",
            "host": postgres_server.host,
            "port": postgres_server.port,
            "login": "postgres",
            "schema": name,
        }
        with openai_dag_env(airflow_home, tmp_path, dags=DAGS, connections={"tickets_db": tickets_db}) as (
            _,
            env,
        ):
            proc = run_airflow(env, "dags", "test", "table_source_classification")
    finally:
        postgres_server.drop_database(name)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, tail(proc)
    ledger = Ledger.from_url(env["AIRFLOW__BATCH_PROVIDER__LEDGER_URL"])
    run_id = ledger.runs("table_source", limit=1)[0]["run_id"]
    rows = {r["app_id"]: r for r in ledger.iter_items("table_source", run_id)}
    email = {f"t{i:03d}" for i in range(1, 41) if i % 5}  # the templated query's channel only
    assert {k for k, r in rows.items() if r["state"] == "succeeded"} == email - {"t017"}
    assert rows["t017"]["state"] == "review" and rows["t017"]["error_code"] == "null_value"
    assert "renders a null value" in rows["t017"]["error_message"]
    assert set(rows) == email
    # 32 email rows with an id and the one without: 31 items, 2 rejects
    assert "33 records read: 31 items, 2 rejected" in output
    staging = Path(env["AIRFLOW__BATCH_PROVIDER__STAGING_ROOT"].removeprefix("file://"))
    (rejects,) = staging.glob("table_source/*/rejects.jsonl")
    kept = {k["code"]: k for k in map(json.loads, rejects.read_text().splitlines())}
    assert set(kept) == {"missing_id", "null_value"}
    # PostgreSQL reads the NULL ids last (one server-side cursor, ORDER BY id NULLS LAST)
    assert "with a NULL id has a NULL 'ticket_id'" in kept["missing_id"]["message"]
    assert json.loads(kept["missing_id"]["record"])["comment"] == "a ticket without an id"
    (results,) = staging.glob("table_source/*/results.jsonl")
    answered = [json.loads(line) for line in results.read_text().splitlines()]
    assert {a["id"] for a in answered if a["state"] == "succeeded"} == email - {"t017"}
    assert all(
        a["output"]["sentiment"] in {"positive", "negative", "neutral"} for a in answered if a["output"]
    )
