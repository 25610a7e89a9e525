"""Invoice entity extraction: every supplier invoice becomes a structured, schema-checked record.

Runs daily at 03:00 UTC through Anthropic Message Batches (half price, with the shared system
prompt served from the prompt cache) on the ``anthropic_batch_default`` connection, or through the
bundled emulator in ``make demo`` and the tests. The output must validate against the prompt's
JSON Schema (invoice number, ISO invoice date, vendor, currency, total, optional line items); an
output that does not is ``invalid_output``: it is retried once (``max_attempts=2``) and then goes
to ``review`` for a person, never into the results table as if it were good. Unchanged invoices
are not sent again.

Moving the workload to another provider is a connection change (and the prompt's ``model``):
``batch_conn_id`` names the connection, whose type picks the adapter.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pendulum
from airflow.sdk import DAG, Asset
from sample_data import generated_records

from airflow_batch_provider.core.options import ChunkOptions
from airflow_batch_provider.pipeline import batch_inference_group

INCLUDE = Path(__file__).resolve().parents[1] / "include"
DATASET_SIZE = 600


def load_invoices(context: Any) -> Iterator[dict[str, Any]]:
    """Yield the invoices to extract (the sample set is generated on first use)."""
    return generated_records("generate_invoice_data", "invoices.jsonl", n=DATASET_SIZE, seed=11)


with DAG(
    dag_id="invoice_entity_extraction",
    schedule="0 3 * * *",
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    tags=["llm-batch", "anthropic"],
    doc_md=__doc__,
):
    batch_inference_group(
        workload="invoice_extraction",
        records=load_invoices,
        prompt=str(INCLUDE / "prompts" / "invoice_extraction.yaml"),
        batch_conn_id="anthropic_batch_default",
        lane="provider",  # a batch API: no connection is read when this file is parsed
        max_attempts=2,
        chunking=ChunkOptions(max_requests=200),
        outlets=[Asset(name="invoice_fields", uri="abp://invoice_extraction/results")],
    )
