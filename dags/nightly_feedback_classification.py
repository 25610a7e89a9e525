"""Nightly feedback classification: every customer comment gets a sentiment and a topic.

Runs at 02:00 UTC through the OpenAI Batch API (half price), or through any OpenAI-compatible
endpoint that the ``openai_batch_default`` connection points at (the bundled emulator in
``make demo``). Unchanged comments are not sent again; failed, expired and missing items are
resubmitted up to three attempts; the run ends with a results table, ``results.jsonl`` and a
cost report (cost per usable result) in staging.
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


def load_comments(context: Any) -> Iterator[dict[str, Any]]:
    """Yield the comments to classify (the sample set is generated on first use)."""
    return generated_records("generate_feedback_data", "feedback_comments.jsonl", n=3000, seed=7)


with DAG(
    dag_id="nightly_feedback_classification",
    schedule="0 2 * * *",
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    tags=["llm-batch", "openai"],
    doc_md=__doc__,
):
    batch_inference_group(
        workload="feedback_classification",
        records=load_comments,
        prompt=str(INCLUDE / "prompts" / "feedback_classification.yaml"),
        batch_conn_id="openai_batch_default",
        lane="provider",  # a batch API: no connection is read when this file is parsed
        max_attempts=3,
        chunking=ChunkOptions(max_requests=1000),
        outlets=[Asset(name="feedback_labels", uri="abp://feedback_classification/results")],
    )
