"""The stack test's workload: 600 synthetic comments in three batches, triggered by hand only."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pendulum
from airflow.sdk import DAG

from airflow_batch_provider.core.options import ChunkOptions
from airflow_batch_provider.pipeline import batch_inference_group

PROMPT = Path(__file__).resolve().parents[3] / "include" / "prompts" / "feedback_classification.yaml"
CHANNELS = ("email", "app", "web")
PRODUCTS = ("kettle", "headphones", "lamp", "blender")


def comments(context: Any) -> Iterator[dict[str, Any]]:
    """Yield the comments (deterministic, so a second run finds them unchanged)."""
    for i in range(600):
        yield {
            "id": f"c{i:04d}",
            "channel": CHANNELS[i % 3],
            "product": PRODUCTS[i % 4],
            "comment": f"Comment number {i}: the delivery was {'late' if i % 2 else 'fast'}.",
        }


with DAG(
    dag_id="stack_feedback",
    schedule=None,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    tags=["llm-batch", "stack-test"],
):
    batch_inference_group(
        workload="stack_feedback",
        records=comments,
        prompt=str(PROMPT),
        batch_conn_id="openai_batch_default",
        max_attempts=3,
        chunking=ChunkOptions(max_requests=200),
    )
