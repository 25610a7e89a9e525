"""A test DAG: the feedback prompt over the rows of a PostgreSQL table, read through the connection ``tickets_db``."""

from __future__ import annotations

from pathlib import Path

import pendulum
from airflow.sdk import DAG

from airflow_batch_provider.core.options import ChunkOptions
from airflow_batch_provider.pipeline import batch_inference_group
from airflow_batch_provider.services.sources_sql import SqlSource

PROMPT = Path(__file__).resolve().parents[3] / "include" / "prompts" / "feedback_classification.yaml"

with DAG(
    dag_id="table_source_classification",
    schedule=None,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    params={"channel": "email"},
    tags=["test"],
):
    batch_inference_group(
        workload="table_source",
        records=SqlSource(
            conn_id="tickets_db",
            sql="SELECT ticket_id, channel, product, comment FROM support_tickets "
            "WHERE channel = '{{ params.channel }}'",
            id_column="ticket_id",
            page_size=7,
        ),
        prompt=str(PROMPT),
        batch_conn_id="openai_batch_default",
        max_attempts=1,
        chunking=ChunkOptions(max_reject_ratio=0.2),
    )
