"""A test DAG: support tickets in a SQL table -> sentiment -> label and confidence written back onto each ticket.

The tickets are read from the connection ``support_db`` (table ``tickets``) and the answers go
back onto the same rows through a ``SqlUpsertSink`` in ``update`` mode.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pendulum
from airflow.sdk import DAG

from airflow_batch_provider.core.options import ChunkOptions
from airflow_batch_provider.pipeline import batch_inference_group
from airflow_batch_provider.sinks import SqlUpsertSink

PROMPT = Path(__file__).resolve().parents[3] / "include" / "prompts" / "feedback_classification.yaml"


def tickets(context: Any) -> Iterator[dict[str, Any]]:
    """The open tickets, read through the connection's hook."""
    from airflow.sdk import BaseHook

    hook = BaseHook.get_connection("support_db").get_hook()
    for ticket_id, channel, product, body in hook.get_records(
        "SELECT ticket_id, channel, product, body FROM tickets ORDER BY ticket_id"
    ):
        yield {"id": str(ticket_id), "channel": channel, "product": product, "comment": body}


with DAG(
    dag_id="ticket_sentiment",
    schedule=None,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    tags=["test"],
):
    batch_inference_group(
        workload="ticket_sentiment",
        records=tickets,
        prompt=str(PROMPT),
        batch_conn_id="openai_batch_default",
        max_attempts=2,
        chunking=ChunkOptions(max_requests=25),
        sinks=[
            SqlUpsertSink(
                conn_id="support_db",
                table="tickets",
                key_columns=["ticket_id"],
                columns={"sentiment": "$.sentiment", "confidence": "$.confidence"},
                mode="update",
                key_type=int,
                batch_size=20,
            )
        ],
    )
