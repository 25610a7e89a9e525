"""Embeddings backfill on your own GPUs: every customer comment gets a vector from ``vllm run-batch``.

The same comments as ``embeddings_backfill``, through the self-hosted lane: each chunk runs as
``vllm run-batch`` in a Kubernetes pod (KubernetesPodOperator, deferrable) serving
``/v1/embeddings``, and the vectors come back through the same ledger, reconcile, resubmit and
publish path as a provider batch; the report carries the pods' GPU time. A last task writes the
vectors as ``vectors.jsonl`` (``{"id", "vector"}`` per line) next to the run's report.

Variables (optional), read when the run's tasks start, never when this file is parsed:
``embeddings_backfill_vllm_conn_id`` (default ``vllm_kubernetes_default``; a ``vllm_kubernetes``
connection), ``embeddings_backfill_vllm_model`` (default ``sentence-transformers/all-MiniLM-L6-v2``:
the model the pod serves, as ``--model`` or a ``--served-model-name`` in the connection's
``extra_args``), ``embeddings_backfill_vllm_chunk`` (requests per pod, default 1000) and
``embeddings_backfill_vllm_limit`` (default 0: every comment; N embeds the first N only).
"""

from __future__ import annotations

import json
from typing import Any

import pendulum
from airflow.sdk import DAG, task
from sample_data import generated_records

from airflow_batch_provider.core.options import ChunkOptions
from airflow_batch_provider.core.requests import PromptTemplate
from airflow_batch_provider.pipeline import batch_inference_group

WORKLOAD = "embeddings_backfill_vllm"
CONN_ID = "{{ var.value.get('embeddings_backfill_vllm_conn_id', 'vllm_kubernetes_default') }}"
CHUNK = "{{ var.value.get('embeddings_backfill_vllm_chunk', '1000') }}"
DEFAULT_MODEL = "sentence-transformers/all-MiniLM-L6-v2"


def setting(name: str, default: str) -> str:
    """Return the Airflow Variable ``embeddings_backfill_vllm_<name>``, read now (inside tasks only).

    :param name: the setting's short name
    :param default: its value when unset
    """
    from airflow.sdk import Variable

    return str(Variable.get(f"{WORKLOAD}_{name}", default=default))


def prompt(context: Any) -> PromptTemplate:
    """The embedding prompt, with this run's model (no ``dimensions``: the model's own size)."""
    return PromptTemplate(
        name="feedback comment embedding (self-hosted)",
        version="emb-vllm-v1",
        model=setting("model", DEFAULT_MODEL),
        kind="embedding",
        user="{{ product }}: {{ comment }}",
        output_format="vector",
    )


def load_comments(context: Any) -> Any:
    """Yield the comments to embed (the sample set is generated on first use)."""
    limit = int(setting("limit", "0"))
    return generated_records("generate_feedback_data", "feedback_comments.jsonl", n=3000, seed=7, limit=limit)


@task
def write_vectors(run_id: str | None = None) -> dict[str, Any]:
    """Write the run's vectors to ``vectors.jsonl`` in staging and return its path and count."""
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
            if vector:
                fh.write(json.dumps({"id": row["app_id"], "vector": vector}).encode("utf-8") + b"\n")
                count += 1
    return {"path": str(target), "vectors": count, "model": setting("model", DEFAULT_MODEL)}


with DAG(
    dag_id="embeddings_backfill_vllm",
    schedule=None,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    tags=["llm-batch", "embeddings", "vllm", "kubernetes"],
    doc_md=__doc__,
):
    group = batch_inference_group(
        workload=WORKLOAD,
        records=load_comments,
        prompt=prompt,
        batch_conn_id=CONN_ID,
        lane="pod",  # the connection id is a template: the lane is not read from the connection
        max_attempts=2,
        chunking=ChunkOptions(max_requests=CHUNK),
    )
    group >> write_vectors()
