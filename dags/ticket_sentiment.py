"""From a table and back: support tickets in PostgreSQL -> sentiment -> the label on each ticket's row.

Reads the rows of ``tickets`` through the Airflow connection ``support_db`` (a postgres
connection), classifies each comment through the batch API, and writes the answer's sentiment and
confidence back onto the ticket's own row: each row once, the latest answer, no row added. Each
negative comment also opens an escalation in the helpdesk behind ``helpdesk_api`` (an http
connection): once per ticket and prompt version, whatever is cleared, retried or killed.
"""

from __future__ import annotations

from pathlib import Path

import pendulum
from airflow.providers.http.hooks.http import HttpHook
from airflow.sdk import DAG

from airflow_batch_provider.pipeline import batch_inference_group
from airflow_batch_provider.services.sources_sql import SqlSource
from airflow_batch_provider.sinks import Consumer, HandOff, SqlUpsertSink

INCLUDE = Path(__file__).resolve().parents[1] / "include"


def open_escalation(handoff: HandOff) -> None:
    """POST one escalation, keyed so that the helpdesk can tell a repeated request from a new one."""
    HttpHook(method="POST", http_conn_id="helpdesk_api").run(
        endpoint="escalations",
        json={"ticket_id": handoff.app_id, "topic": handoff.output["topic"]},
        headers={"Idempotency-Key": handoff.key},  # one per ticket and prompt version
    )


with DAG(
    dag_id="ticket_sentiment",
    schedule="0 3 * * *",
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    tags=["llm-batch", "sql"],
):
    batch_inference_group(
        workload="ticket_sentiment",
        records=SqlSource(
            conn_id="support_db",  # a postgres connection (sqlite, mysql ... work the same)
            sql="SELECT ticket_id, channel, product, body AS comment FROM tickets",
            id_column="ticket_id",  # the application id; the other columns are the template's fields
        ),
        prompt=str(INCLUDE / "prompts" / "feedback_classification.yaml"),
        batch_conn_id="openai_batch_default",
        lane="provider",  # a batch API: no connection is read when this file is parsed
        sinks=[
            SqlUpsertSink(
                conn_id="support_db",
                table="tickets",
                key_columns=["ticket_id"],  # the application id goes here
                columns={"sentiment": "$.sentiment", "confidence": "$.confidence"},
                mode="update",  # onto the ticket's own row; "upsert" inserts missing rows too
                key_type=int,  # ticket_id is an integer column
            ),
            Consumer(
                name="escalations",  # the task deliver_escalations
                act=open_escalation,
                where=lambda handoff: handoff.output["sentiment"] == "negative",
            ),
        ],
    )
