"""Invoice line item categories: step 2 of a chain, run whenever the invoice extraction publishes.

Scheduled on the ``invoice_fields`` Asset that ``invoice_entity_extraction`` (step 1) updates when
its publish task ends. Each run reads the answers the ``invoice_extraction`` workload published in
its newest finished run, one record per billed line of each invoice (its id ``<invoice id>:<n>``),
and gives each line a spend category through Anthropic Message Batches. An invoice that went to
review in step 1 has no answer and gives no line; a line whose text did not change since the last
run is not sent again, so after a night in which one invoice changed only its changed lines are paid
for; the lines of an invoice that left step 1's input leave this one's.
"""

from __future__ import annotations

from pathlib import Path

import pendulum
from airflow.sdk import DAG, Asset

from airflow_batch_provider.pipeline import batch_inference_group
from airflow_batch_provider.services.sources_workload import WorkloadSource

INCLUDE = Path(__file__).resolve().parents[1] / "include"
# the Asset step 1's publish updates (dags/invoice_entity_extraction.py)
INVOICE_FIELDS = Asset(name="invoice_fields", uri="abp://invoice_extraction/results")

with DAG(
    dag_id="invoice_line_item_categories",
    schedule=[INVOICE_FIELDS],
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    tags=["llm-batch", "anthropic", "chained"],
    doc_md=__doc__,
):
    batch_inference_group(
        workload="invoice_line_items",
        records=WorkloadSource(
            workload="invoice_extraction",  # step 1's workload, in the same ledger
            each="$.answer.line_items",  # one record per element; its id "<invoice id>:<n>"
            fields={  # the template's fields: paths into the answer and the element
                "description": "$.item.description",
                "amount": "$.item.amount",
                "currency": "$.answer.currency",
            },
        ),
        prompt=str(INCLUDE / "prompts" / "line_item_category.yaml"),
        batch_conn_id="anthropic_batch_default",
        lane="provider",  # a batch API: no connection is read when this file is parsed
        max_attempts=2,
    )
