"""Feedback classification whose provider is chosen by its connection alone (a test DAG).

The DAG code never names a provider: ``batch_conn_id`` is fixed (``llm_batch``) and the
connection's type picks the adapter. The only other thing that changes with the provider is the
model id, read here from ``ABP_SWITCH_MODEL`` (OpenAI ``gpt-4o-mini``, Bedrock
``anthropic.claude-3-5-haiku-20241022-v1:0``); the records file comes from ``ABP_SWITCH_RECORDS``.
Chunks hold 150 requests (``ABP_SWITCH_CHUNK``) so that every Bedrock job stays above its
100-record minimum; a smaller remainder goes through the real-time API.
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import pendulum
from airflow.sdk import DAG

from airflow_batch_provider.core.options import ChunkOptions
from airflow_batch_provider.core.requests import PromptTemplate
from airflow_batch_provider.pipeline import batch_inference_group

PROMPT = Path(__file__).resolve().parents[3] / "include" / "prompts" / "feedback_classification.yaml"

with DAG(
    dag_id="provider_switch_feedback",
    schedule=None,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    tags=["llm-batch", "test"],
):
    template = PromptTemplate.from_yaml(PROMPT)
    batch_inference_group(
        workload="provider_switch",
        records=os.environ.get("ABP_SWITCH_RECORDS", "file:///nonexistent/records.jsonl"),
        prompt=replace(template, model=os.environ.get("ABP_SWITCH_MODEL", template.model)),
        batch_conn_id="llm_batch",
        max_attempts=1,
        chunking=ChunkOptions(max_requests=int(os.environ.get("ABP_SWITCH_CHUNK", "150"))),
    )
