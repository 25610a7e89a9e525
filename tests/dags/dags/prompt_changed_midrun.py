"""A run whose prompt file is edited while it runs (a test DAG).

The prompt is the YAML file named by the environment variable ``ABP_MIDRUN_PROMPT`` (v1: text
answers). The records callable, run by prepare after prepare read the prompt, rewrites the file
as v2 (JSON answers with a schema), as a person deploying a new prompt during the run would. The
later tasks read the new file.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pendulum
from airflow.sdk import DAG

from airflow_batch_provider.pipeline import batch_inference_group

DEFAULT = Path(__file__).resolve().parents[3] / "include" / "prompts" / "feedback_classification.yaml"
PROMPT = os.environ.get("ABP_MIDRUN_PROMPT", str(DEFAULT))

V2 = """\
version: v2
model: gpt-4o-mini
user: "Label as JSON: {{ comment }}"
output_format: json
output_schema: {type: object, required: [label], properties: {label: {type: string}}}
"""


def records(context: Any) -> Iterator[dict[str, Any]]:
    for i in range(6):
        yield {"id": f"c{i}", "channel": "email", "product": "Lamp", "comment": f"great lamp {i}"}
    if "ABP_MIDRUN_PROMPT" in os.environ:
        Path(PROMPT).write_text(V2, encoding="utf-8")


with DAG(
    dag_id="prompt_changed_midrun",
    schedule=None,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    tags=["llm-batch", "test"],
):
    batch_inference_group(
        workload="prompt_changed_midrun",
        records=records,
        prompt=PROMPT,
        batch_conn_id="openai_batch_default",
        lane="provider",
        max_attempts=1,
    )
