"""A test DAG for lineage: two workloads, each from a source into a sink, both named in templates.

``tickets``: the rows of a PostgreSQL query (connection ``support_db``) -> the label back onto each
row of ``tickets``. ``reviews``: a local JSONL file (its path a DAG param) -> a SQLite table
``review_labels`` (connection ``labels_db``).
"""

from __future__ import annotations

import os
from pathlib import Path

import pendulum
from airflow.sdk import DAG

from airflow_batch_provider.operators.sources import RecordSource
from airflow_batch_provider.pipeline import batch_inference_group
from airflow_batch_provider.services.sources_sql import SqlSource
from airflow_batch_provider.sinks import SqlUpsertSink

PROMPT = Path(__file__).resolve().parents[3] / "include" / "prompts" / "feedback_classification.yaml"

with DAG(
    dag_id="lineage_two_ways",
    schedule=None,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    params={"channel": "email", "reviews": os.environ.get("ABP_LINEAGE_REVIEWS", "/nonexistent.jsonl")},
    tags=["test"],
):
    sources_and_sinks: dict[str, tuple[RecordSource, SqlUpsertSink]] = {
        "tickets": (
            SqlSource(
                conn_id="support_db",
                sql="SELECT ticket_id, channel, product, body AS comment FROM tickets "
                "WHERE channel = '{{ params.channel }}'",
                id_column="ticket_id",
            ),
            SqlUpsertSink(
                conn_id="support_db",
                table="tickets",
                key_columns=["ticket_id"],
                columns={"sentiment": "$.sentiment"},
                mode="update",
                key_type=int,
            ),
        ),
        "reviews": (
            "{{ params.reviews }}",
            SqlUpsertSink(
                conn_id="labels_db",
                table="review_labels",
                key_columns=["id"],
                columns={"sentiment": "$.sentiment"},
            ),
        ),
    }
    for workload, (records, sink) in sources_and_sinks.items():
        batch_inference_group(
            workload=workload,
            records=records,
            prompt=str(PROMPT),
            batch_conn_id="openai_batch_default",
            lane="provider",
            max_attempts=1,
            sinks=[sink],
        )
