"""A run whose connection Variable changes while it runs (a test DAG).

``batch_conn_id`` is a template over the Variable ``abp_midrun_conn``. The records callable, run by
prepare after prepare rendered its own connection id, sets that Variable to another connection,
as a person editing it in the UI during the run would. The later tasks render the new id.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pendulum
from airflow.sdk import DAG

from airflow_batch_provider.pipeline import batch_inference_group

PROMPT = Path(__file__).resolve().parents[3] / "include" / "prompts" / "feedback_classification.yaml"


def records(context: Any) -> Iterator[dict[str, Any]]:
    from airflow.sdk import Variable

    for i in range(6):
        yield {"id": f"c{i}", "channel": "email", "product": "Lamp", "comment": f"great lamp {i}"}
    Variable.set("abp_midrun_conn", "openai_batch_other")


with DAG(
    dag_id="conn_changed_midrun",
    schedule=None,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    tags=["llm-batch", "test"],
):
    batch_inference_group(
        workload="conn_changed_midrun",
        records=records,
        prompt=str(PROMPT),
        batch_conn_id="{{ var.value.get('abp_midrun_conn', 'openai_batch_default') }}",
        lane="provider",
        max_attempts=1,
    )
