"""Embeddings backfill: every customer comment gets a vector, at batch prices.

Runs through Gemini Batch Mode (``gemini-embedding-001``) on the ``gemini_batch_default``
connection, or through any other provider with an embeddings batch endpoint: the provider is the
connection, and the model goes with it. Both are Airflow Variables, read when the tasks run
(through the Task SDK: the connection id is a template, the prompt and the records are callables),
never when the file is parsed; set them in the UI, the CLI, a secrets backend or the environment
(``AIRFLOW_VAR_<NAME>``):

- ``embeddings_backfill_conn_id`` (default ``gemini_batch_default``)
- ``embeddings_backfill_model`` (default ``gemini-embedding-001``; e.g. ``text-embedding-3-small``
  with an ``openai_batch`` connection)
- ``embeddings_backfill_dimensions`` (default 256; OpenAI's ``dimensions``, mapped to Gemini's
  ``outputDimensionality``)
- ``embeddings_backfill_limit`` (default 0: every comment; a smaller number embeds the first N only)

Unchanged comments are not embedded again. Vectors land in the ledger's results table and in
``results.jsonl`` (as each item's ``output``) through the standard publish step; a last task
writes them once more as ``vectors.jsonl`` (``{"id", "vector"}`` per line, succeeded items only)
next to the run's report in staging, the file a vector index loader reads.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pendulum
from airflow.sdk import DAG, Asset, task
from sample_data import generated_records

from airflow_batch_provider.core.options import ChunkOptions
from airflow_batch_provider.core.requests import PromptTemplate
from airflow_batch_provider.pipeline import batch_inference_group

INCLUDE = Path(__file__).resolve().parents[1] / "include"
WORKLOAD = "embeddings_backfill"


def setting(name: str, default: str) -> str:
    """Return the Airflow Variable ``embeddings_backfill_<name>``, read now through the Task SDK.

    Called inside tasks only (the Task SDK reads Variables at run time, not at parse time).

    :param name: the setting's short name
    :param default: its value when unset
    """
    from airflow.sdk import Variable

    return str(Variable.get(f"{WORKLOAD}_{name}", default=default))


#: The provider connection, chosen when the run's tasks are rendered.
CONN_ID = "{{ var.value.get('embeddings_backfill_conn_id', 'gemini_batch_default') }}"


def prompt(context: Any) -> PromptTemplate:
    """The embedding prompt, with this run's model and dimensions from the Variables."""
    return PromptTemplate(
        name="feedback comment embedding",
        version="emb-v1",
        model=setting("model", "gemini-embedding-001"),
        kind="embedding",
        user="{{ product }}: {{ comment }}",
        params={"dimensions": int(setting("dimensions", "256"))},
        output_format="vector",
    )


def load_comments(context: Any) -> Iterator[dict[str, Any]]:
    """Yield the comments to embed (the sample set is generated on first use)."""
    limit = int(setting("limit", "0"))
    return generated_records("generate_feedback_data", "feedback_comments.jsonl", n=3000, seed=7, limit=limit)


@task
def write_vectors(run_id: str | None = None) -> dict[str, Any]:
    """Write the run's vectors to ``vectors.jsonl`` in staging and return its path and size."""
    from airflow_batch_provider.hooks.ledger import LedgerHook
    from airflow_batch_provider.staging import Staging

    assert run_id is not None
    ledger = LedgerHook(None).get_conn()
    staging = Staging()
    target = staging.run_dir(WORKLOAD, run_id) / "vectors.jsonl"
    count = 0
    with staging.writer(target) as fh:
        for row in ledger.iter_items(
            WORKLOAD, run_id, states=["succeeded"], columns=["app_id", "output_json"]
        ):
            vector = json.loads(row["output_json"]) if row["output_json"] else None
            if not vector:
                continue
            fh.write(json.dumps({"id": row["app_id"], "vector": vector}).encode("utf-8") + b"\n")
            count += 1
    return {
        "path": str(target),
        "vectors": count,
        "dimensions": int(setting("dimensions", "256")),
        "model": setting("model", "gemini-embedding-001"),
    }


with DAG(
    dag_id="embeddings_backfill",
    schedule=None,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    tags=["llm-batch", "embeddings", "gemini", "openai"],
    doc_md=__doc__,
):
    group = batch_inference_group(
        workload=WORKLOAD,
        records=load_comments,
        prompt=prompt,
        batch_conn_id=CONN_ID,
        max_attempts=3,
        chunking=ChunkOptions(max_requests=1000),
        outlets=[Asset(name="feedback_comment_vectors", uri="abp://embeddings_backfill/results")],
    )
    group >> write_vectors()
