"""A test DAG: the feedback prompt over a JSONL file named by ABP_BAD_INPUT_PATH (bad records in it)."""

from __future__ import annotations

import os
from pathlib import Path

import pendulum
from airflow.sdk import DAG

from airflow_batch_provider.core.options import ChunkOptions
from airflow_batch_provider.pipeline import batch_inference_group

PROMPT = Path(__file__).resolve().parents[3] / "include" / "prompts" / "feedback_classification.yaml"

with DAG(
    dag_id="bad_input_classification",
    schedule=None,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    tags=["test"],
):
    batch_inference_group(
        workload="bad_input",
        records=os.environ.get("ABP_BAD_INPUT_PATH", "/nonexistent.jsonl"),
        prompt=str(PROMPT),
        batch_conn_id="openai_batch_default",
        max_attempts=1,
        chunking=ChunkOptions(
            max_bytes=20_000, max_reject_ratio=float(os.environ.get("ABP_MAX_REJECT_RATIO", "0.2"))
        ),
    )
