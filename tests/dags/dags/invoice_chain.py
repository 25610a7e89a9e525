"""A test DAG: two workloads chained in one DAG, invoice extraction then the category of each billed line.

Step 1 reads the invoices of the JSONL file named by ``ABP_CHAIN_INVOICES``; step 2 reads the
answers step 1 published, one record per line item. ``extract >> categorise``: step 2's prepare
starts after step 1's publish.
"""

from __future__ import annotations

import os
from pathlib import Path

import pendulum
from airflow.sdk import DAG

from airflow_batch_provider.pipeline import batch_inference_group
from airflow_batch_provider.services.sources_workload import WorkloadSource

PROMPTS = Path(__file__).resolve().parents[3] / "include" / "prompts"

with DAG(
    dag_id="invoice_chain",
    schedule=None,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    tags=["test"],
):
    extract = batch_inference_group(
        workload="chain_invoices",
        records=os.environ.get("ABP_CHAIN_INVOICES", "/nonexistent.jsonl"),
        prompt=str(PROMPTS / "invoice_extraction.yaml"),
        batch_conn_id="anthropic_batch_default",
        lane="provider",
        max_attempts=2,
    )
    categorise = batch_inference_group(
        workload="chain_lines",
        records=WorkloadSource(
            workload="chain_invoices",
            each="$.answer.line_items",
            fields={
                "description": "$.item.description",
                "amount": "$.item.amount",
                "currency": "$.answer.currency",
            },
        ),
        prompt=str(PROMPTS / "line_item_category.yaml"),
        batch_conn_id="anthropic_batch_default",
        lane="provider",
        max_attempts=2,
    )
    extract >> categorise
