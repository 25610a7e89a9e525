"""Morning feedback digest: yesterday's comments, labelled by 06:30 Berlin time, whatever happens.

The support team reads the digest at its 07:00 stand-up, so the labels are due at 06:30
Europe/Berlin. The run starts at 01:00 UTC and goes through the Batch API at half price; a batch
usually finishes in minutes, but the provider only promises 24 hours. At 06:20 (a ten-minute
margin) the deadline branch takes over: open batches are cancelled and what they finished is
harvested, and the items still open go through the real-time API at full price
(``sync_fallback``), rate-limited to the key's limits, so the digest is complete on time. The cost
report shows what the fallback cost on top. A budget of $5 stops the run before it submits
anything if the estimate is higher (e.g. a runaway input file).

Other policies: ``publish_pending`` (publish what is done; the rest is reported as pending and
picked up by the next run) or ``skip``. There is no default: a DAG with a deadline must say.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pendulum
from airflow.sdk import DAG, Asset
from sample_data import generated_records

from airflow_batch_provider.core.options import BudgetOptions, ChunkOptions, DeadlineOptions, FallbackLimits
from airflow_batch_provider.pipeline import batch_inference_group

INCLUDE = Path(__file__).resolve().parents[1] / "include"


def load_comments(context: Any) -> Iterator[dict[str, Any]]:
    """Yield the comments to label (the sample set is generated on first use)."""
    return generated_records("generate_feedback_data", "feedback_comments.jsonl", n=3000, seed=7)


with DAG(
    dag_id="morning_feedback_digest",
    schedule="0 1 * * *",
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    tags=["llm-batch", "openai", "deadline"],
    doc_md=__doc__,
):
    batch_inference_group(
        workload="feedback_digest",
        records=load_comments,
        prompt=str(INCLUDE / "prompts" / "feedback_classification.yaml"),
        batch_conn_id="openai_batch_default",
        lane="provider",  # a batch API: no connection is read when this file is parsed
        max_attempts=2,
        chunking=ChunkOptions(max_requests=1000),
        deadline=DeadlineOptions("06:30 Europe/Berlin", "sync_fallback", margin_s=600),
        fallback=FallbackLimits(rpm=500, tpm=200_000, concurrency=16),
        budget=BudgetOptions(budget_usd=5),
        outlets=[Asset(name="feedback_digest", uri="abp://feedback_digest/results")],
    )
